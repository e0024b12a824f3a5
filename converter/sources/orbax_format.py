"""An Orbax PyTree checkpoint's layout on disk, read without importing Orbax (or JAX, which Orbax imports).

The MaxText -> HF direction only reads: the tree of leaves in `_METADATA` (JSON), and each array through the
TensorStore spec Orbax's own restore opens it with (orbax-checkpoint 0.12.8's `build_array_read_spec`: zarr3 or
zarr v2, in the OCDBT database at the items directory or in a directory of its own). Importing Orbax for those
two costs about 0.9 CPU-seconds of JAX and Orbax start-up on every run, more than a tenth of what converting a
2.5 GB checkpoint back costs in all (docs/benchmark-results.md). orbax_format_test.py checks these specs against
Orbax's `get_json_tspec_read` and the tree against Orbax's `PyTreeCheckpointHandler.metadata`, so a change in
either shows up there rather than as an unreadable checkpoint.
"""

from __future__ import annotations

import dataclasses
import posixpath
from typing import Any

from converter import json_input, storage
from converter.errors import ConversionError
from converter.checkpoint_format import layout
ARRAY_VALUE_TYPES = ("jax.Array", "np.ndarray")  # What Orbax's array handlers record; scalars are "scalar".
_SEQUENCE_KEY = 1  # Orbax's KeyType: a list or tuple position; 2 is a dict key.
_REMOTE_READ_COALESCING = {  # Orbax's settings for reads from a bucket: adjacent chunk reads merged into one request.
    "experimental_read_coalescing_threshold_bytes": 1000000,
    "experimental_read_coalescing_merged_bytes": 500000000000,
    "experimental_read_coalescing_interval": "1ms",
}


@dataclasses.dataclass(frozen=True)
class TreeLayout:
  """What `_METADATA` says of a checkpoint: its leaves and how its arrays are stored."""

  leaves: tuple[tuple[tuple[str, ...], str], ...]  # (keys, Orbax's value type), dict keys sorted, lists in order.
  use_zarr3: bool
  use_ocdbt: bool

  @property
  def array_paths(self) -> list[tuple[str, ...]]:
    return [keys for keys, value_type in self.leaves if value_type in ARRAY_VALUE_TYPES]


def param_name(keys: tuple[str, ...]) -> str:
  """Orbax's name of the leaf at `keys`: the array's path in the checkpoint."""
  return ".".join(keys)


def read_tree_layout(items_path: str) -> TreeLayout:
  """The leaves of the PyTree checkpoint at `items_path` (e.g. OUT/0/items), from its `_METADATA`."""
  metadata_path = layout.tree_metadata_path(items_path)
  if not storage.is_file(metadata_path):
    raise ConversionError(f"{items_path}: not an Orbax PyTree checkpoint (no {layout.TREE_METADATA} file)")
  metadata = json_input.read(metadata_path, "unreadable checkpoint tree metadata")
  order = lambda leaf: tuple((0, int(key), "") if kind == _SEQUENCE_KEY else (1, 0, key) for key, kind in leaf[0])
  try:
    leaves = []
    for entry in metadata["tree_metadata"].values():
      keys = tuple((str(key["key"]), key["key_type"]) for key in entry["key_metadata"])
      value = entry["value_metadata"]
      value_type = "skipped" if value.get("skip_deserialize") else value["value_type"]
      if not isinstance(value_type, str):
        raise TypeError(f"value_type {value_type!r} is not a string")
      leaves.append((keys, value_type))
    leaves.sort(key=order)
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    raise ConversionError(f"{metadata_path}: not the metadata of an Orbax PyTree checkpoint ({type(e).__name__}:"
                          f" {e})") from e
  use_ocdbt = storage.is_file(storage.join(items_path, layout.OCDBT_MANIFEST))
  if metadata.get("use_ocdbt") and not use_ocdbt:
    raise ConversionError(f"{storage.join(items_path, layout.OCDBT_MANIFEST)}: missing: {metadata_path} says the"
                          " arrays are in an OCDBT database, and this is its manifest (a copy that left it behind,"
                          " or a step that was never committed)")
  return TreeLayout(
      leaves=tuple((tuple(key for key, _ in keys), value_type) for keys, value_type in leaves),
      use_zarr3=bool(metadata.get("use_zarr3", False)),
      use_ocdbt=use_ocdbt,
  )


def array_read_spec(items_path: str, name: str, use_zarr3: bool, use_ocdbt: bool) -> dict[str, Any]:
  """The TensorStore spec Orbax restores the array `name` of the checkpoint at `items_path` with."""
  directory = storage.kvstore_spec(items_path)
  if not use_ocdbt:
    kvstore = {**directory, "path": posixpath.join(directory["path"], name)}
  elif directory["driver"] == "file":  # As Orbax: data files written in place, the manifest replaced atomically.
    base = {**directory, "path": directory["path"] + "/"}
    kvstore = {"driver": "ocdbt", "base": {**base, "file_io_locking": {"mode": "non_atomic"}}, "manifest": base,
               "path": name, "cache_pool": "cache_pool#ocdbt"}
  else:
    kvstore = {"driver": "ocdbt", "base": directory, "path": name, "cache_pool": "cache_pool#ocdbt",
               **_REMOTE_READ_COALESCING}
  return {"driver": "zarr3" if use_zarr3 else "zarr", "kvstore": kvstore, "recheck_cached_data": False,
          "recheck_cached_metadata": False, "fill_missing_data_reads": False}
