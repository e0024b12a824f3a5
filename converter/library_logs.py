"""Which log records the converter shows by default."""

import logging
import os

_OWN_PACKAGES = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), package) + os.sep
                      for package in ("converter", "handlers"))


def drop_library_tracebacks(record: logging.LogRecord) -> bool:
  """Drops the tracebacks that libraries (Orbax's futures, gcsfs' retries) log on their way to raising an error
  the converter then reports itself, naming the output and tensor, on one `error:` line; -v=1 keeps them.

  A library is whatever lives outside the converter's own packages: installed with `pip --target`, under a
  distribution's dist-packages or in the repository's .venv, its path need not hold "site-packages"."""
  return not (record.exc_info and not os.path.abspath(record.pathname).startswith(_OWN_PACKAGES))
