"""Local output written behind: its pages reach the disk while later ones are written, then leave the page cache.

Streaming gigabytes through the page cache, each write lands in a page the kernel must first find, and when
free memory is pages the VM's host has taken back that costs more than the copy: writing 2.5 GB took 1.6-4.6 s
of CPU here, varying run to run, and in one 2.5 GB conversion to MaxText a third of all CPU samples were the
kernel copying into fresh cache pages. Written behind, an output occupies a window of the cache that the next
writes reuse: the same 2.5 GB took 0.7-0.8 CPU-s and 1.07 s of wall, at the disk's own pace, against 4.0-4.7 s
written plainly and fsync'd. Writeback of each new stretch is started (`sync_file_range`), a stretch a few
windows back is waited for and dropped (`posix_fadvise DONTNEED`), so that little is dirty at once and the
output is mostly on disk when the conversion ends.

Two users: `WriteBehindFile`, a file this process writes itself (the safetensors of the reverse direction), and
`WriteBehindDirectory`, which does the same from a thread of its own for the OCDBT data files tensorstore
writes during an Orbax save. Where the calls do not exist (not Linux), or the first of them fails (a
filesystem without them), both do nothing beyond plain writes: writing behind only saves time.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import os
import sys
import threading
import time
from collections.abc import Iterator

from absl import logging

DEFAULT_WINDOW = 32 << 20
DEFAULT_LAG = 3
# A directory watcher sleeps at least this many times as long as its last round took: at most a fifth of a core.
_ROUND_SHARE = 4
_SETTLED_S = 5.0  # How long a data file written behind whole is watched for more bytes.
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_WAIT_BEFORE = 1
_WRITE = 2
_WAIT_AFTER = 4


def _load_sync_file_range():
  if not sys.platform.startswith("linux") or not hasattr(os, "posix_fadvise"):
    return None
  try:
    function = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).sync_file_range
  except (OSError, AttributeError):
    return None
  function.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
  function.restype = ctypes.c_int
  return function


_SYNC_FILE_RANGE = _load_sync_file_range()
AVAILABLE = _SYNC_FILE_RANGE is not None


def _sync_range(fd: int, offset: int, length: int, flags: int) -> None:
  if _SYNC_FILE_RANGE(fd, offset, length, flags) != 0:
    error = ctypes.get_errno()
    raise OSError(error, f"sync_file_range: {os.strerror(error)}")


class _Behind:
  """The write-behind state of one open file: bytes whose writeback was started, and bytes dropped."""

  def __init__(self, fd: int):
    self.fd = fd
    self.started = 0
    self.dropped = 0

  def start(self, size: int) -> None:
    """Starts writeback of everything up to `size` not yet started (returns at once)."""
    if size > self.started:
      _sync_range(self.fd, self.started, size - self.started, _WRITE)
      self.started = size

  def drop(self, up_to: int) -> None:
    """Waits until the bytes before `up_to` are on disk, then drops them from the page cache."""
    if up_to > self.dropped:
      _sync_range(self.fd, self.dropped, up_to - self.dropped, _WAIT_BEFORE | _WRITE | _WAIT_AFTER)
      # From the page the last drop ended in: the kernel drops whole pages only, and that one is now complete.
      start = self.dropped - self.dropped % _PAGE
      os.posix_fadvise(self.fd, start, up_to - start, os.POSIX_FADV_DONTNEED)
      self.dropped = up_to


class WriteBehindFile:
  """A binary file created (or truncated) at `path` for sequential writes: `write`, `tell`, `close` as a file's.
  Every `window` bytes written, writeback of them starts, and what was written `lag` windows before is waited
  for and dropped: with a few windows in flight the disk's queue stays full (2.5 GB here: 1.3 s at lag 1,
  1.07 s at lag 3, against 4-4.7 s written plainly and fsync'd while memory was slow to come by)."""

  def __init__(self, path: str, window: int = DEFAULT_WINDOW, lag: int = DEFAULT_LAG):
    if lag < 1:
      raise ValueError(f"lag must be at least one window, not {lag}")
    self._file = open(path, "wb", buffering=0)
    self._window = window
    self._written = 0
    self._behind = _Behind(self._file.fileno()) if AVAILABLE else None
    self._starts: collections.deque[int] = collections.deque(maxlen=lag)  # Where the last `lag` windows began.

  def write(self, data) -> int:
    view = memoryview(data).cast("B")
    total = len(view)
    while view:
      n = self._file.write(view)
      view = view[n:]
      self._written += n
    behind = self._behind
    if behind is not None and self._written - behind.started >= self._window:
      try:
        if len(self._starts) == self._starts.maxlen:
          behind.drop(self._starts[0])
        self._starts.append(behind.started)
        behind.start(self._written)
      except OSError as e:
        logging.warning("%s: written plainly from byte %d on: %s", self._file.name, self._written, e)
        self._behind = None
    return total

  def tell(self) -> int:
    return self._written

  def fileno(self) -> int:
    return self._file.fileno()

  def close(self) -> None:
    """Closes the file once every byte is on disk: a file published after it (the reverse direction renames its
    output into place) must not be found short after a crash."""
    try:
      os.fsync(self._file.fileno())
    finally:
      self._file.close()

  def __enter__(self) -> "WriteBehindFile":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class WriteBehindDirectory:
  """While open, a thread writes behind every file below `directory` that sits in a directory named one of
  `data_dirs` (`d`: where OCDBT puts its data files; the manifests and metadata beside them are small and
  rewritten in place). Each file's new bytes get their writeback started on one round and are dropped on the next
  (every `interval` seconds). Errors are logged, never raised: writing behind only saves time."""

  def __init__(self, directory: str, data_dirs: tuple[str, ...] = ("d",), interval: float = 0.05):
    self._directory = directory
    self._data_dirs = data_dirs
    self._interval = interval
    # By inode (one output is on one filesystem): Orbax renames the directories at its commit. Open files; the
    # files written behind whole and closed, with their size and when: one that grows again is opened again, until
    # it has been left alone for _SETTLED_S; then only its inode is kept, and it is not looked at again (a whole
    # giant model leaves about 100,000 data files: a stat of each every round took most of a core, and a tuple
    # kept for each plus a round's whole listing held in lists grew the heap by 50 MB).
    self._open: dict[int, _Behind] = {}
    self._done: dict[int, tuple[int, float]] = {}
    self._settled: set[int] = set()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name="hf2maxtext-write-behind", daemon=True)

  def __enter__(self) -> "WriteBehindDirectory":
    if AVAILABLE:
      self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    if AVAILABLE:
      self._stop.set()
      self._thread.join()
    for behind in self._open.values():
      os.close(behind.fd)
    self._open.clear()

  def _run(self) -> None:
    try:
      pause = self._interval
      while not self._stop.wait(pause):
        started = time.monotonic()
        self._round()
        pause = max(self._interval, _ROUND_SHARE * (time.monotonic() - started))  # Listing grows with the files.
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("writing %s behind stopped: %s: %s", self._directory, type(e).__name__, e)

  def _round(self) -> None:
    now = time.monotonic()
    for path, inode in self._data_files():
      if inode in self._settled:
        continue
      done = self._done.get(inode)
      if done is not None:
        if now - done[1] > _SETTLED_S:
          del self._done[inode]
          self._settled.add(inode)
          continue
        try:
          if os.stat(path).st_size == done[0]:
            continue
        except FileNotFoundError:  # Renamed with its directory (Orbax's commit) since the listing.
          continue
      behind = self._open.get(inode)
      if behind is None:
        try:
          behind = self._open[inode] = _Behind(os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
        except FileNotFoundError:  # Renamed with its directory (Orbax's commit) since the listing.
          continue
      behind.drop(behind.started)  # What the last round started.
      size = os.fstat(behind.fd).st_size
      if behind.dropped == size:  # Nothing new since the last round, and all of it on disk: finished.
        os.close(behind.fd)
        del self._open[inode]
        self._done[inode] = (size, now)
        continue
      behind.start(size)

  def _data_files(self) -> Iterator[tuple[str, int]]:
    """(path, inode) of every file in a data directory below the output, from the listings alone (no stat), one
    entry at a time: a round holds no listing whole."""
    directories = [self._directory]
    while directories:
      directory = directories.pop()
      data = os.path.basename(directory) in self._data_dirs
      try:
        with os.scandir(directory) as entries:
          for entry in entries:
            if entry.is_dir(follow_symlinks=False):
              directories.append(entry.path)
            elif data:
              yield entry.path, entry.inode()
      except (FileNotFoundError, NotADirectoryError):  # Renamed (Orbax's commit) since its parent was listed.
        continue
