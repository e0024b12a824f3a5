"""Directories in TMPDIR that a killed run cannot leave behind: the next run of the converter (or of a tool that
makes one) removes them.

A run that dies by SIGKILL, the out-of-memory killer or a preempted machine runs no cleanup, so what it staged in
TMPDIR (a Hub push's shards, up to two of the model's) would stay until a reboot. Each directory made here is
named `hf2maxtext-KIND-PID@HOST-XXXXXXXX` and holds an flock on itself for as long as it is in use; the kernel drops
the lock the moment its holder dies, however it dies. `sweep` (run by the converter at start-up and before every
`claim`) removes each such directory of this host whose lock it can take: its owner is dead, since a live one
holds the lock. Directories named for another host are left alone (a TMPDIR shared between hosts may not carry
flocks between them), as are those of other users.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import socket
import tempfile
from typing import Iterator

from absl import logging

PREFIX = "hf2maxtext-"
_NAME = re.compile(re.escape(PREFIX) + r"(?P<kind>[a-z-]+)-(?P<pid>\d+)@(?P<host>[\w.-]+)-[\w]+")


def _host() -> str:
  return re.sub(r"[^\w.-]", "_", socket.gethostname()) or "localhost"


class ScratchDirectory:
  """A directory of this process in TMPDIR, locked until `release` removes it."""

  def __init__(self, path: str, fd: int):
    self.path = path
    self._fd: int | None = fd

  def release(self) -> None:
    """Removes the directory, then lets go of its lock (in that order: a sweep never sees it unlocked and alive)."""
    if self._fd is None:
      return
    shutil.rmtree(self.path, ignore_errors=True)
    os.close(self._fd)
    self._fd = None


def _lock_if_dead(path: str) -> int | None:
  """An open descriptor of our directory at `path` holding its flock, or None when another process holds the lock
  (its owner is alive) or it is not a directory of ours."""
  try:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
  except OSError:
    return None
  try:
    if os.fstat(fd).st_uid == os.geteuid():
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      return fd
  except OSError:  # Held; or a filesystem without flock, where no directory can be told dead.
    pass
  os.close(fd)
  return None


def sweep(parent: str | None = None) -> list[str]:
  """Removes the directories in `parent` (default TMPDIR) that dead runs of this host left; returns their paths."""
  parent = parent or tempfile.gettempdir()
  try:
    names = os.listdir(parent)
  except OSError:
    return []
  removed = []
  for name in sorted(names):
    match = _NAME.fullmatch(name)
    if not match or match.group("host") != _host():
      continue
    path = os.path.join(parent, name)
    fd = _lock_if_dead(path)
    if fd is None:
      continue  # Alive (or not ours to remove).
    try:
      shutil.rmtree(path, ignore_errors=True)
    finally:
      os.close(fd)
    logging.info("removed %s, left by a %s run (pid %s) that was killed", path, match.group("kind"),
                 match.group("pid"))
    removed.append(path)
  return removed


def claim(kind: str, parent: str | None = None) -> ScratchDirectory:
  """A fresh directory in `parent` (default TMPDIR), locked as this process's, after sweeping dead runs' ones."""
  parent = parent or tempfile.gettempdir()
  sweep(parent)
  while True:
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-{os.getpid()}@{_host()}-", dir=parent)
    try:
      fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
      continue  # A concurrent sweep found it unlocked and removed it.
    try:
      fcntl.flock(fd, fcntl.LOCK_EX)  # Waits while a concurrent sweep, which found it unlocked, removes it.
    except OSError:
      return ScratchDirectory(path, fd)  # No flock on this filesystem: no sweep can take it for a dead run's.
    if os.fstat(fd).st_nlink > 0:
      return ScratchDirectory(path, fd)
    os.close(fd)


@contextlib.contextmanager
def directory(kind: str, parent: str | None = None) -> Iterator[str]:
  """`claim` for the length of a block: the directory's path, removed when the block ends."""
  claimed = claim(kind, parent)
  try:
    yield claimed.path
  finally:
    claimed.release()
