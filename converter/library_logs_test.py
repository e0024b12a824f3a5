"""The default log filter: a library's traceback is dropped (the converter reports the error itself, on one
line) wherever the library is installed; the converter's own tracebacks and every record without one are kept."""

import logging
import os
import sys

from absl.testing import absltest
from absl.testing import parameterized

from converter import library_logs


def _record(pathname: str, with_traceback: bool) -> logging.LogRecord:
  exc_info = None
  if with_traceback:
    try:
      raise ValueError("boom")
    except ValueError:
      exc_info = sys.exc_info()
  return logging.LogRecord("orbax", logging.ERROR, pathname, 1, "raised", None, exc_info)


class DropLibraryTracebacksTest(parameterized.TestCase):

  @parameterized.parameters(
      "/usr/lib/python3.11/site-packages/orbax/checkpoint/_src/futures/future.py",
      "/usr/lib/python3/dist-packages/orbax/checkpoint/_src/futures/future.py",
      "/tmp/site/orbax/checkpoint/_src/futures/future.py",  # pip install --target
      os.path.join(os.path.dirname(os.path.dirname(library_logs.__file__)), ".venv", "lib", "orbax", "future.py"),
  )
  def test_a_library_traceback_is_dropped_wherever_it_is_installed(self, pathname):
    self.assertFalse(library_logs.drop_library_tracebacks(_record(pathname, with_traceback=True)))
    self.assertTrue(library_logs.drop_library_tracebacks(_record(pathname, with_traceback=False)))

  @parameterized.parameters(library_logs.__file__, os.path.join(os.path.dirname(os.path.dirname(library_logs.__file__)),
                                                        "handlers", "streaming.py"))
  def test_the_converters_own_traceback_is_kept(self, pathname):
    self.assertTrue(library_logs.drop_library_tracebacks(_record(pathname, with_traceback=True)))


if __name__ == "__main__":
  absltest.main()
