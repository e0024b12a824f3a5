"""A kind of output storage: what differs between a local disk and a bucket, chosen once per output.

Orbax commits a step on a local disk by renaming its temporary directory, and in a bucket (which has no rename) by
writing a commit file last. Everything around the save follows the same split: how the output is locked against
a second writer, how the resume journal is made durable, how an HF checkpoint is staged and published, whether
the save's files are written behind. The owners of an output (converter/output/maxtext.py, huggingface.py) ask
their destination (chosen by converter/output/destinations.py) and never test the path themselves.
"""

from __future__ import annotations

import json
import threading
from typing import ContextManager, Protocol, Sequence

from handlers.write_options import BlockWritten


class Lock(Protocol):
  """One writer per output (converter/output/lock.py)."""

  lost: str | None  # Why the lock was lost mid-conversion (a bucket lease taken over), else None.

  def acquire(self) -> None:
    """Takes the lock, or raises ConversionError naming its holder."""

  def release(self) -> None:
    ...


class Journal(Protocol):
  """The blocks whose writes have completed, durable at most a fixed interval late (converter/output/resume.py)."""

  path: str

  def __call__(self, event: BlockWritten) -> None:
    ...

  def close(self) -> None:
    """Makes every entry durable; raises ConversionError when that fails."""


def journal_line(event: BlockWritten) -> str:
  """One journal entry: a JSON line naming the array, the block's region and, where it was written in pieces to
  restoring hosts' databases, each piece's region and database (read back by resume.py)."""
  entry = {"a": event.array_name, "s": list(event.start), "e": list(event.stop)}
  if event.pieces:
    entry["p"] = [[list(start), list(stop), database] for start, stop, database in event.pieces]
  return json.dumps(entry) + "\n"


class Destination(Protocol):
  """Where one output lives, and how its steps are committed there."""

  path: str

  def lock(self, lock_path: str, lease_s: float, on_lost: threading.Event | None) -> Lock:
    ...

  def journal(self, path: str) -> Journal:
    ...

  def unfinished_steps(self) -> list[str]:
    """What an interrupted save left of step 0: never something a loader takes for a checkpoint."""

  def has_committed_step(self) -> bool:
    """Whether step 0 is a finished checkpoint (what MaxText would load)."""

  def check_writable(self) -> None:
    """Raises ConversionError when the output cannot be written."""

  def writing(self) -> ContextManager[None]:
    """Wraps an Orbax save into the output (local disks write its data files behind)."""

  def stage(self, overwrite: bool, shared: bool) -> str:
    """Checks the output can be (re)placed by an HF checkpoint and returns where to write it (`shared`: a place
    every process of a multi-process conversion finds by name)."""

  def shared_staging(self) -> str:
    """Where the primary process's `stage(..., shared=True)` put the files."""

  def finished_file(self, path: str) -> None:
    """A file of the staged HF checkpoint is complete (a Hub repo uploads it now, and frees the disk)."""

  def publish(self, staging: str, unsynced: Sequence[str]) -> None:
    """Makes the staged HF checkpoint the output, whole or not at all; `unsynced`: the files in `staging` its
    writers did not sync themselves."""

  def discard(self, staging: str) -> None:
    """Removes what a failed HF checkpoint left staged (the primary process's call)."""
