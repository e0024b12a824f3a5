"""One writer per output: a conversion holds OUTPUT.hf2maxtext-lock (beside the output, in either direction) from
before it touches the output until it has committed or cleaned up.

Without it, a second conversion into the same output deletes the first one's unfinished files and both die in
OCDBT (`Configuration mismatch on uuid`, `NOT_FOUND`). On a local disk the lock is an flock on that file: the
kernel drops it the moment its holder dies, so a lock can never outlive a dead conversion. A bucket has no flock,
so there the lock is an object created only if absent (a generation precondition), holding a lease that its
holder renews every `lease_s / 4`; a lease not renewed within `lease_s` belongs to a dead conversion and is taken
over (deleted by its generation, so two newcomers cannot both take it).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import socket
import threading
import time
import uuid
from typing import Iterator

from absl import logging

from converter import storage
from converter.errors import ConversionError

SUFFIX = ".hf2maxtext-lock"
LEASE_S = float(os.environ.get("HF2MAXTEXT_LOCK_LEASE_S", "60"))


def lock_path(output_dir: str) -> str:
  return output_dir.rstrip("/") + SUFFIX


def _holder_record(lease_s: float) -> dict:
  return {"holder": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid(),
          "started": time.time(), "renewed": time.time(), "lease_s": lease_s}


def _describe(record: dict) -> str:
  started = datetime.datetime.fromtimestamp(record.get("started", 0), datetime.timezone.utc)
  return f"pid {record.get('pid', '?')} on {record.get('host', '?')}, started {started:%Y-%m-%d %H:%M:%S} UTC"


class _LocalLock:
  """flock on a local file; the file keeps its holder's description for the refusal message."""

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
        raise ConversionError(f"{self.path[: -len(SUFFIX)]}: output directory is not writable: cannot create its"
                              f" lock file {self.path} ({e.strerror})") from e
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
    os.write(fd, json.dumps(_holder_record(0)).encode())
    self._fd = fd

  def _refusal(self) -> str:
    try:
      with open(self.path, encoding="utf-8") as f:
        holder = _describe(json.load(f))
    except (OSError, ValueError):
      holder = "holder unknown"
    output = self.path[: -len(SUFFIX)]
    return (f"{output}: another conversion is writing there ({holder}; it holds {self.path}). Wait for it to"
            " finish or stop it; a dead conversion's lock is released by the system at once, so this one is alive")

  def release(self) -> None:
    if self._fd is None:
      return
    with contextlib.suppress(OSError):
      os.unlink(self.path)
    os.close(self._fd)
    self._fd = None


class _BucketLock:
  """A lock object with a lease, renewed by a background thread."""

  def __init__(self, path: str, lease_s: float, on_lost: threading.Event | None):
    self.path = path
    self.lease_s = lease_s
    self._on_lost = on_lost
    self._record = _holder_record(lease_s)
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self.lost: str | None = None

  def _fs(self):
    return storage.filesystem(self.path, version_aware=True)

  def _create(self) -> bool:
    try:
      self._fs().pipe_file(self.path, json.dumps(self._record).encode(), mode="create")
      return True
    except FileExistsError:
      return False
    except Exception as e:  # pylint: disable=broad-except
      if "412" in str(e) or "precondition" in str(e).lower():
        return False
      raise storage.remote_error(self.path, e, "creating the lock object") from e

  def _current(self) -> tuple[dict | None, str | None]:
    """The lock object's record and generation; (None, None) when there is none."""
    fs = self._fs()
    try:
      fs.invalidate_cache(self.path)
      info = fs.info(self.path)
      record = json.loads(fs.cat_file(self.path))
    except FileNotFoundError:
      return None, None
    except ValueError:
      record = {}
    return record, str(info.get("generation") or "")

  def acquire(self) -> None:
    storage.check_bucket(self.path)
    for _ in range(3):
      if self._create():
        break
      record, generation = self._current()
      if record is None:
        continue  # Released between our attempt and our look.
      age = time.time() - float(record.get("renewed", 0))
      lease = float(record.get("lease_s", self.lease_s))
      output = self.path[: -len(SUFFIX)]
      if age <= lease:
        raise ConversionError(
            f"{output}: another conversion is writing there ({_describe(record)}; lock object {self.path}, lease"
            f" renewed {age:.0f} s ago). Wait for it to finish or stop it; a lock whose lease was last renewed more"
            f" than {lease:.0f} s ago is stale (its holder died) and is taken over automatically")
      logging.warning("%s: taking over a stale lock (%s, lease renewed %.0f s ago, lease %.0f s)", self.path,
                      _describe(record), age, lease)
      with contextlib.suppress(FileNotFoundError):  # Another newcomer took it first: our create then fails.
        self._fs().rm_file(f"{self.path}#{generation}" if generation else self.path)
    else:
      raise ConversionError(f"{self.path}: could not take the output's lock (other conversions keep taking it)")
    self._thread = threading.Thread(target=self._renew, name="output-lock-lease", daemon=True)
    self._thread.start()

  def _held_record(self) -> dict | None:
    """The lock object's record, read under the retry policy (None when there is none)."""
    try:
      return json.loads(storage.read_bytes(self.path))
    except ConversionError as e:
      if "not found" in str(e):
        return None
      raise
    except ValueError:
      return {}

  def _renew(self) -> None:
    while not self._stop.wait(self.lease_s / 4):
      try:
        record = self._held_record()
        if record is None or record.get("holder") != self._record["holder"]:
          taken = "deleted" if record is None else f"taken over by {_describe(record)}"
          self._lose(f"the lock object {self.path} was {taken} (this conversion stalled past its lease)")
          return
        self._record["renewed"] = time.time()
        storage.write_text(self.path, json.dumps(self._record))
      except ConversionError as e:
        logging.warning("%s: renewing the lease failed (%s); retrying", self.path, e)

  def _lose(self, reason: str) -> None:
    self.lost = reason
    logging.error("%s: lost the output's lock: %s", self.path, reason)
    if self._on_lost is not None:
      self._on_lost.set()

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if self.lost is None:
      try:
        storage.delete(self.path)
      except ConversionError as e:  # The bucket is failing: the lease expires on its own.
        logging.warning("%s: could not delete the lock object (%s); the next conversion takes it over once its"
                        " lease (%.0f s) has expired", self.path, e, self.lease_s)


@contextlib.contextmanager
def hold(output_dir: str, *, on_lost: threading.Event | None = None, lease_s: float = LEASE_S) -> Iterator[object]:
  """Holds the output's lock for the block, or raises ConversionError naming whoever holds it. `on_lost` is set
  if a bucket lease is lost mid-conversion (the holder then stops before its next block and commits nothing)."""
  path = lock_path(output_dir)
  lock = _BucketLock(path, lease_s, on_lost) if storage.is_remote(output_dir) else _LocalLock(path)
  lock.acquire()
  try:
    yield lock
  finally:
    lock.release()
