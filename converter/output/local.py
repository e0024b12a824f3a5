"""An output on a local disk: Orbax commits a step by renaming its temporary directory, so a step directory is
always finished; the lock is an flock, the resume journal an fsync'd file, an HF checkpoint is staged beside the
output and renamed into place."""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import shutil
import tempfile
import threading
import time
from typing import ContextManager, Sequence

from converter import storage
from converter.errors import ConversionError
from converter.checkpoint_format import layout
from converter.output import lock as lock_lib
from converter.output.destination import Journal, Lock, journal_line
from converter.write_behind import WriteBehindDirectory
from handlers.write_options import BlockWritten

FSYNC_INTERVAL_S = 0.5


class LocalLock:
  """flock on a local file; the file keeps its holder's description for the refusal message. The kernel drops
  the lock the moment its holder dies, so it can never outlive a dead conversion."""

  def __init__(self, path: str):
    self.path = path
    self._fd: int | None = None
    self.lost: str | None = None

  def acquire(self) -> None:
    import fcntl  # pylint: disable=g-import-not-at-top

    storage.make_dirs(os.path.dirname(self.path))
    while True:
      try:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      except OSError as e:
        raise ConversionError(f"{lock_lib.output_of(self.path)}: output directory is not writable: cannot create"
                              f" its lock file {self.path} ({e.strerror})") from e
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as e:
        os.close(fd)
        if e.errno not in (errno.EAGAIN, errno.EACCES):
          raise ConversionError(f"{self.path}: cannot lock the output: {e}") from e
        raise ConversionError(self._refusal()) from None
      # The previous holder may have unlinked the file between our open and flock: then lock the new one.
      try:
        if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
          break
      except FileNotFoundError:
        pass
      os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(lock_lib.holder_record(0)).encode())
    self._fd = fd

  def _refusal(self) -> str:
    try:
      with open(self.path, encoding="utf-8") as f:
        holder = lock_lib.describe(json.load(f))
    except (OSError, ValueError):
      holder = "holder unknown"
    return (f"{lock_lib.output_of(self.path)}: another conversion is writing there ({holder}; it holds"
            f" {self.path}). Wait for it to finish or stop it; a dead conversion's lock is released by the system at"
            " once, so this one is alive")

  def release(self) -> None:
    if self._fd is None:
      return
    with contextlib.suppress(OSError):
      os.unlink(self.path)
    os.close(self._fd)
    self._fd = None


class LocalJournal:
  """Appends written blocks to a file, fsync'd at most every FSYNC_INTERVAL_S (a lost tail is redone)."""

  def __init__(self, path: str):
    self.path = path
    self._file = open(path, "a", encoding="utf-8")
    self._lock = threading.Lock()
    self._last_sync = time.monotonic()
    self._closed = False

  def __call__(self, event: BlockWritten) -> None:
    line = journal_line(event)
    with self._lock:
      self._file.write(line)
      self._file.flush()
      if time.monotonic() - self._last_sync >= FSYNC_INTERVAL_S:
        os.fsync(self._file.fileno())
        self._last_sync = time.monotonic()

  def close(self) -> None:
    with self._lock:
      if self._closed:
        return
      self._closed = True
      self._file.flush()
      os.fsync(self._file.fileno())
      self._file.close()


def sync(path: str) -> None:
  """Waits until `path` (a file or a directory's entries) is on disk."""
  descriptor = os.open(path, os.O_RDONLY)
  try:
    os.fsync(descriptor)
  finally:
    os.close(descriptor)


class LocalDisk:
  """A local output directory."""

  def __init__(self, path: str):
    self.path = path

  def lock(self, lock_path: str, lease_s: float, on_lost: threading.Event | None) -> Lock:
    del lease_s, on_lost  # An flock is never lost.
    return LocalLock(lock_path)

  def journal(self, path: str) -> Journal:
    return LocalJournal(path)

  def unfinished_steps(self) -> list[str]:
    return sorted(glob.glob(layout.step_path(self.path) + layout.TMP_SUFFIX + "*"))

  def has_committed_step(self) -> bool:
    return os.path.exists(layout.step_path(self.path))

  def check_writable(self) -> None:
    if not os.access(self.path, os.W_OK):
      raise ConversionError(f"{self.path}: output directory is not writable")

  def writing(self) -> ContextManager[None]:
    return WriteBehindDirectory(self.path)

  def shared_staging(self) -> str:
    return os.path.join(os.path.dirname(self.path), f".{os.path.basename(self.path)}.hf2maxtext-tmp-shared")

  def stage(self, overwrite: bool, shared: bool) -> str:
    """A fresh staging directory next to the output, with the usual mode (mkdtemp makes it 0700)."""
    output_dir = self.path
    self._remove_dead_staging()
    if os.path.exists(output_dir) and not (os.path.isdir(output_dir) and not os.listdir(output_dir)):
      if not overwrite:
        raise ConversionError(f"{output_dir}: already exists and is not empty; pass --overwrite to replace it")
      if not os.path.isdir(output_dir):
        raise ConversionError(f"{output_dir}: exists and is not a directory")
    parent = os.path.dirname(output_dir)
    try:
      os.makedirs(parent, exist_ok=True)
      if shared:
        staging = self.shared_staging()
        shutil.rmtree(staging, ignore_errors=True)  # A dead run's; the output lock keeps live ones out.
        os.makedirs(staging)
      else:
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(output_dir)}.hf2maxtext-tmp-", dir=parent)
      umask = os.umask(0)
      os.umask(umask)
      os.chmod(staging, 0o777 & ~umask)
      return staging
    except OSError as e:
      raise ConversionError(f"{parent}: cannot create a staging directory for the output: {e}") from e

  def finished_file(self, path: str) -> None:
    del path  # Published with the rest.

  def _remove_dead_staging(self) -> None:
    """The staging directories a killed way back left beside the output (the output's lock, held, says no live
    conversion owns them), and an output a killed `publish` had already replaced. A staging directory beside
    its `.old` was killed between `publish`'s two renames: both are kept, the new checkpoint whole in one and
    the previous in the other, for the user to choose."""
    prefix = os.path.join(os.path.dirname(self.path), f".{os.path.basename(self.path)}.hf2maxtext-tmp-")
    for dead in glob.glob(glob.escape(prefix) + "*"):
      if dead.endswith(".old"):
        replaced = os.path.exists(self.path) and not os.path.exists(dead.removesuffix(".old"))
        if not replaced:
          continue
      elif os.path.exists(dead + ".old"):
        continue
      shutil.rmtree(dead, ignore_errors=True)

  def discard(self, staging: str) -> None:
    storage.remove_tree(staging)

  def publish(self, staging: str, unsynced: Sequence[str]) -> None:
    """Renames the finished staging directory to the output, replacing what --overwrite allowed to replace.

    The shards are on disk already (each writer syncs its file on close); the `unsynced` files (the index and
    config.json) and the staging directory's entries are synced before the rename and the parent's after it, so
    that a crash leaves either no output or a whole one, never a config.json beside short shards.
    """
    for name in unsynced:
      if os.path.exists(os.path.join(staging, name)):
        sync(os.path.join(staging, name))
    sync(staging)
    old = None
    if os.path.exists(self.path):
      old = staging + ".old"
      os.rename(self.path, old)
    try:
      os.rename(staging, self.path)
    except OSError:
      if old:
        os.rename(old, self.path)
      raise
    sync(os.path.dirname(self.path))
    if old:
      shutil.rmtree(old, ignore_errors=True)
