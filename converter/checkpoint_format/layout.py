"""Where Orbax puts a checkpoint's pieces: the one place that knows their names (read by the sources, written by
the output).

A save of step 0 into OUTPUT_DIR writes OUTPUT_DIR/0/{items, _CHECKPOINT_METADATA}. How a step is committed
depends on the kind of storage (a rename on a local disk, a commit file in a bucket: converter/output/local.py and
bucket.py). Arrays live in each writing process's OCDBT database, items/ocdbt.process_N, until Orbax merges them
on commit.
"""

from __future__ import annotations

from converter import storage
from converter.errors import ConversionError

STEP = 0
ITEMS = "items"
METADATA = "_CHECKPOINT_METADATA"
TREE_METADATA = "_METADATA"  # In items/: the tree's leaves and how its arrays are stored.
OCDBT_MANIFEST = "manifest.ocdbt"  # In items/ once the arrays are in one OCDBT database (Orbax's default).
COMMIT_MARKER = "commit_success.txt"
TMP_SUFFIX = ".orbax-checkpoint-tmp"  # Local disks: the step before its rename.
# Where Tunix's CheckpointManager (tunix/sft/checkpoint_manager.py; MaxText's train_sft and train_rl use it) saves
# the model: <root>/<step>/model_params, the NNX state `nnx.state(model)` (optimizer_state beside it).
TUNIX_MODEL_PARAMS = "model_params"


def step_path(output_dir: str) -> str:
  return storage.join(output_dir, str(STEP))


def items_path(output_dir: str) -> str:
  return storage.join(step_path(output_dir), ITEMS)


def tree_metadata_path(items: str) -> str:
  """The tree's _METADATA in items/: what a source of its leaves is read from until their arrays are opened."""
  return storage.join(items, TREE_METADATA)


def metadata_path(items: str) -> str:
  """The step's _CHECKPOINT_METADATA, beside its items."""
  return storage.join(storage.parent(items), METADATA)


def process_database(items: str, process: int | str = 0) -> str:
  """Where process `process` wrote its arrays before the commit merged them (or a database named as a process
  is: a restoring host's part, handlers/host_databases.py)."""
  return storage.join(items, f"ocdbt.process_{process}")


def kvstore_base(path: str) -> str:
  """A tensorstore kvstore URL for `path` (file:// for local paths, gs:// and s3:// as they are)."""
  return path if storage.is_remote(path) else f"file://{path}"


def items_path_of(checkpoint_path: str) -> str:
  """OUT/0/items as given, or found below OUT/0 (a step directory; a Tunix step's model_params)."""
  path = storage.resolve(checkpoint_path)
  if not storage.is_file(tree_metadata_path(path)):
    for name in (ITEMS, TUNIX_MODEL_PARAMS):
      items = storage.join(path, name)
      if storage.is_file(tree_metadata_path(items)):
        return items
  if not storage.exists(path):
    raise ConversionError(f"{path}: no such checkpoint directory (expected OUTPUT_DIR/0/items)")
  return path


def uncommitted_reason(items: str) -> str | None:
  """Why the step holding `items` (OUT/N/items, or a checkpoint saved straight into `items`) is not a finished save,
  as Orbax decides it (orbax.checkpoint's `is_path_finalized`); None when it is finished.

  On a local disk Orbax commits a step by renaming its temporary directory (`N.orbax-checkpoint-tmp...`) to N: a
  step still under such a name never finished, whatever it holds (Orbax 0.12 also writes commit_success.txt
  before the rename; older versions, and MaxText runs with them, write none). In a bucket there is no rename: the
  step is committed by writing commit_success.txt into it last, so a step without one never finished (or lost its
  marker)."""
  step = storage.parent(items)
  if not storage.is_remote(items):
    unfinished = [p for p in (items, step) if TMP_SUFFIX in storage.basename(p)]
    if unfinished:
      return (f"{unfinished[-1]} is the temporary directory of a save that never finished (Orbax renames it to the"
              " step's own name when it commits)")
    return None
  if any(storage.exists(storage.join(p, COMMIT_MARKER)) for p in (step, items)):
    return None
  return (f"neither {step} nor {items} holds {COMMIT_MARKER}, which Orbax writes into a step in a bucket last,"
          " when the save has finished")
