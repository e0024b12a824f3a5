"""An output in a bucket (gs://): no rename, so Orbax writes step 0 in place and commits it by writing
commit_success.txt last (a step without it is unfinished); no flock, so the lock is an object with a lease; no
appends, so the resume journal is a series of small objects; an HF checkpoint is written in place, config.json
last (what makes it a checkpoint)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import ContextManager, Sequence

from absl import logging

from converter import storage
from converter.errors import ConversionError
from converter.checkpoint_format import layout
from converter.output import lock as lock_lib
from converter.output.destination import Journal, Lock, journal_line
from handlers.write_options import BlockWritten

UPLOAD_INTERVAL_S = 0.5


class BucketLock:
  """A lock object created only if absent (a generation precondition), holding a lease that its holder renews
  every `lease_s / 4` from a thread of its own; a lease not renewed within `lease_s` belongs to a dead conversion
  and is taken over (deleted by its generation, so two newcomers cannot both take it)."""

  def __init__(self, path: str, lease_s: float, on_lost: threading.Event | None):
    self.path = path
    self.lease_s = lease_s
    self._on_lost = on_lost
    self._record = lock_lib.holder_record(lease_s)
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
      if age <= lease:
        raise ConversionError(
            f"{lock_lib.output_of(self.path)}: another conversion is writing there ({lock_lib.describe(record)};"
            f" lock object {self.path}, lease renewed {age:.0f} s ago). Wait for it to finish or stop it; a lock"
            f" whose lease was last renewed more than {lease:.0f} s ago is stale (its holder died) and is taken"
            " over automatically")
      logging.warning("%s: taking over a stale lock (%s, lease renewed %.0f s ago, lease %.0f s)", self.path,
                      lock_lib.describe(record), age, lease)
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
          taken = "deleted" if record is None else f"taken over by {lock_lib.describe(record)}"
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


class BucketJournal:
  """Written blocks as a series of objects (`PATH.000000`, ...), one per UPLOAD_INTERVAL_S of them, uploaded by a
  thread of its own so that a slow or failing bucket never holds up the save's event loop."""

  def __init__(self, path: str):
    self.path = path
    self._pending: list[str] = []
    self._parts = 0
    self._closed = False
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._uploader = threading.Thread(target=self._upload_every_interval, name="resume-journal", daemon=True)
    self._uploader.start()

  def __call__(self, event: BlockWritten) -> None:
    line = journal_line(event)
    with self._lock:
      self._pending.append(line)

  def _upload(self) -> None:
    """Writes the pending entries as the next part; raises ConversionError (keeping them) when it cannot."""
    with self._lock:
      lines, self._pending = self._pending, []
    if not lines:
      return
    try:
      storage.write_text(f"{self.path}.{self._parts:06d}", "".join(lines))
    except ConversionError:
      with self._lock:
        self._pending[:0] = lines
      raise
    self._parts += 1

  def _upload_every_interval(self) -> None:
    while not self._stop.wait(UPLOAD_INTERVAL_S):
      try:
        self._upload()
      except ConversionError as e:
        # Not fatal by itself: the entries are retried with the next interval, and the blocks of any that are
        # never written are redone by --resume.
        logging.warning("resume journal: %s; retrying", e)

  def close(self) -> None:
    with self._lock:
      if self._closed:
        return
      self._closed = True
    self._stop.set()
    self._uploader.join()
    self._upload()


class Bucket:
  """An output prefix in a bucket."""

  def __init__(self, path: str):
    self.path = path

  def lock(self, lock_path: str, lease_s: float, on_lost: threading.Event | None) -> Lock:
    return BucketLock(lock_path, lease_s, on_lost)

  def journal(self, path: str) -> Journal:
    return BucketJournal(path)

  def unfinished_steps(self) -> list[str]:
    step = layout.step_path(self.path)
    return [step] if storage.exists(step) and not self.has_committed_step() else []

  def has_committed_step(self) -> bool:
    return storage.exists(storage.join(layout.step_path(self.path), layout.COMMIT_MARKER))

  def check_writable(self) -> None:
    pass  # Known once the first object is written; storage.make_dirs has checked the bucket exists.

  def writing(self) -> ContextManager[None]:
    return contextlib.nullcontext()

  def shared_staging(self) -> str:
    return self.path

  def stage(self, overwrite: bool, shared: bool) -> str:
    del shared  # Every process writes into the prefix itself.
    if storage.list_names(self.path):
      if not overwrite:
        raise ConversionError(f"{self.path}: already exists and is not empty; pass --overwrite to replace it")
      storage.remove_tree(self.path)
    storage.check_bucket(self.path)
    return self.path

  def finished_file(self, path: str) -> None:
    del path  # Published with the rest.

  def discard(self, staging: str) -> None:
    storage.remove_tree(staging)

  def publish(self, staging: str, unsynced: Sequence[str]) -> None:
    del staging, unsynced  # Written in place: config.json, written last, made it a checkpoint.
