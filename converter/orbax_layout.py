"""Where Orbax puts a checkpoint's pieces, on local disks and in buckets alike: the one place that knows.

A save of step 0 into OUTPUT_DIR writes OUTPUT_DIR/0/{items, _CHECKPOINT_METADATA}. On a local disk Orbax writes
into OUTPUT_DIR/0.orbax-checkpoint-tmp-* and renames it on commit, so a step directory is always finished; in a
bucket (no rename) it writes OUTPUT_DIR/0 in place and commits by writing OUTPUT_DIR/0/commit_success.txt last,
so a step directory without it is unfinished. Arrays live in each writing process's OCDBT database,
items/ocdbt.process_N, until Orbax merges them on commit.
"""

from __future__ import annotations

from converter import storage

STEP = 0
ITEMS = "items"
METADATA = "_CHECKPOINT_METADATA"
COMMIT_MARKER = "commit_success.txt"
_TMP_SUFFIX = ".orbax-checkpoint-tmp"


def step_path(output_dir: str) -> str:
  return storage.join(output_dir, str(STEP))


def items_path(output_dir: str) -> str:
  return storage.join(step_path(output_dir), ITEMS)


def metadata_path(items: str) -> str:
  """The step's _CHECKPOINT_METADATA, beside its items."""
  return storage.join(storage.parent(items), METADATA)


def unfinished_paths(output_dir: str) -> list[str]:
  """What an interrupted save left: Orbax's temporary step directories (local), or the step directory itself
  when it was never committed (bucket)."""
  if storage.is_remote(output_dir):
    step = step_path(output_dir)
    return [step] if storage.exists(step) and not storage.exists(storage.join(step, COMMIT_MARKER)) else []
  import glob  # pylint: disable=g-import-not-at-top

  return sorted(glob.glob(step_path(output_dir) + _TMP_SUFFIX + "*"))


def is_committed(output_dir: str) -> bool:
  """Whether OUTPUT_DIR holds a finished step 0 (what MaxText would load)."""
  step = step_path(output_dir)
  if storage.is_remote(output_dir):
    return storage.exists(storage.join(step, COMMIT_MARKER))
  return storage.exists(step)


def process_database(items: str, process: int = 0) -> str:
  """Where process `process` wrote its arrays before the commit merged them."""
  return storage.join(items, f"ocdbt.process_{process}")


def kvstore_base(path: str) -> str:
  """A tensorstore kvstore URL for `path` (file:// for local paths, gs:// and s3:// as they are)."""
  return path if storage.is_remote(path) else f"file://{path}"
