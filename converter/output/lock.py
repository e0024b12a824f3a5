"""One writer per output: a conversion holds OUTPUT.hf2maxtext-lock (beside the output, in either direction) from
before it touches the output until it has committed or cleaned up.

Without it, a second conversion into the same output deletes the first one's unfinished files and both die in
OCDBT (`Configuration mismatch on uuid`, `NOT_FOUND`). The lock is the destination's: an flock on a local disk
(converter/output/local.py), an object with a lease in a bucket (bucket.py).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Iterator

from converter.errors import ConversionError

if TYPE_CHECKING:
  from converter.output.destination import Destination, Lock

SUFFIX = ".hf2maxtext-lock"
LEASE_S = float(os.environ.get("HF2MAXTEXT_LOCK_LEASE_S", "60"))


def lock_path(output_dir: str) -> str:
  return output_dir.rstrip("/") + SUFFIX


def output_of(path: str) -> str:
  """The output a lock file or object guards."""
  return path[: -len(SUFFIX)]


def holder_record(lease_s: float) -> dict:
  return {"holder": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid(),
          "started": time.time(), "renewed": time.time(), "lease_s": lease_s}


def describe(record: dict) -> str:
  started = datetime.datetime.fromtimestamp(record.get("started", 0), datetime.timezone.utc)
  return f"pid {record.get('pid', '?')} on {record.get('host', '?')}, started {started:%Y-%m-%d %H:%M:%S} UTC"


@contextlib.contextmanager
def hold(destination: Destination, *, on_lost: threading.Event | None = None,
         lease_s: float = LEASE_S) -> Iterator[Lock]:
  """Holds the output's lock for the block, or raises ConversionError naming whoever holds it. `on_lost` is set
  if a bucket lease is lost mid-conversion (the holder then stops before its next block and commits nothing);
  a ConversionError raised inside the block after that says so. The caller passes the destination it chose:
  its kinds (local.py, bucket.py) import this module, which therefore does not choose among them."""
  lock = destination.lock(lock_path(destination.path), lease_s, on_lost)
  lock.acquire()
  try:
    yield lock
  except ConversionError as e:
    if lock.lost:
      raise ConversionError(f"{e} ({lock.lost})") from e
    raise
  finally:
    lock.release()
