"""One converter process that runs many forward conversions, each exactly as `converter/main.py FLAGS` runs it.

The matrix tests convert a hundred tiny models; as separate processes, most of each conversion's time is the
process starting (Python, JAX, Orbax and tensorstore imports, JAX's devices). JAX's simulated device count is fixed
for a process's life, so harness.run_conversion keeps one of these per device count and sends it each conversion's
flags. Each request goes through the binary's own entry point (`converter.main.main`, after absl parses the flags
as `app.run` would) with this process's stdout and stderr redirected to the request's files; a request that does
not exit 0 is run again as a fresh process by the harness, so a failure is always the binary's own.

Protocol: one JSON object per line on stdin ({"argv": [...], "stdout": PATH, "stderr": PATH}); one JSON object
per line ({"returncode": N}) on the file descriptor named by the only argument.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import traceback
from typing import Any, Iterator


@contextlib.contextmanager
def _redirected(stdout_path: str, stderr_path: str) -> Iterator[None]:
  """File descriptors 1 and 2 (Python's streams, absl's log handler and C++ logging alike) into the two files."""
  sys.stdout.flush()
  sys.stderr.flush()
  saved = os.dup(1), os.dup(2)
  with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    try:
      yield
    finally:
      sys.stdout.flush()
      sys.stderr.flush()
      os.dup2(saved[0], 1)
      os.dup2(saved[1], 2)
      for fd in saved:
        os.close(fd)


def _run(cli: Any, argv: list[str]) -> int:
  """`converter/main.py ARGV`'s exit status, run in this process."""
  try:
    cli.FLAGS.unparse_flags()  # Every flag back to its default, as in a fresh process.
    cli.FLAGS(["converter", *argv])
    cli.main(["converter"])
    return 0
  except SystemExit as e:
    return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  except BaseException:  # pylint: disable=broad-except  (anything else: the harness reruns it as a process)
    traceback.print_exc()
    return 1
  finally:
    # main() turns the collector off until start-up is done and then freezes what exists: undo both, so that one
    # conversion's garbage does not outlive it.
    gc.enable()
    gc.unfreeze()
    gc.collect()


def main() -> None:
  responses = os.fdopen(int(sys.argv[1]), "w")
  from absl import logging  # pylint: disable=g-import-not-at-top

  from converter import main as cli  # pylint: disable=g-import-not-at-top

  logging.use_absl_handler()  # What app.run sets up before calling main.
  for line in sys.stdin:
    request = json.loads(line)
    with _redirected(request["stdout"], request["stderr"]):
      code = _run(cli, request["argv"])
    responses.write(json.dumps({"returncode": code}) + "\n")
    responses.flush()


if __name__ == "__main__":
  main()
