"""A child process reused for one request after another: the tests' way to pay a heavy start-up (JAX, Orbax,
MaxText's import) once for many cases.

The child reads one JSON request per line on its standard input and answers each with one JSON line on a pipe
whose file descriptor its command line names (its own standard output and error stay free for what it runs).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
from typing import Any, Callable


class ReusedProcess:

  def __init__(self, command: Callable[[int], list[str]], env: dict[str, str], cwd: str | None = None):
    """`command(fd)`: the child's command line, naming `fd`, the descriptor it answers on."""
    read_fd, write_fd = os.pipe()
    self.process = subprocess.Popen(command(write_fd), stdin=subprocess.PIPE, env=env, cwd=cwd, pass_fds=(write_fd,),
                                    text=True)
    os.close(write_fd)
    self._answers = os.fdopen(read_fd, "r")

  @property
  def alive(self) -> bool:
    return self.process.poll() is None

  def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any] | None:
    """The child's answer, or None when it died or took longer than `timeout` seconds (it is then stopped)."""
    try:
      self.process.stdin.write(json.dumps(message) + "\n")
      self.process.stdin.flush()
      ready, _, _ = select.select([self._answers], [], [], timeout)
      line = self._answers.readline() if ready else ""
    except OSError:
      line = ""
    if not line:
      self.close()
      return None
    return json.loads(line)

  def close(self) -> None:
    if self.alive:
      self.process.kill()
    self.process.wait()
    self._answers.close()
