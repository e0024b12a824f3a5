"""Reads a converted checkpoint back through Orbax v0 and v1, on any device count: as numpy, or as MaxText restores
it on the hardware (`jax.Array`s sharded over a mesh of a platform's devices)."""

from __future__ import annotations

import json
import math
import os
from typing import Any, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp

from converter import storage
from converter.layout import chunking
from converter.checkpoint_format.record import ConversionRecord, leaf_name


def _items_and_step(items_path: str) -> tuple[str, str]:
  """(items, step) of OUT/0/items, local (made absolute) or in a bucket (as given)."""
  items_path = storage.resolve(items_path.rstrip("/"))
  return items_path, storage.parent(items_path)


def restore_v0(items_path: str) -> dict[str, Any]:
  """Through v0 `PyTreeCheckpointer`, as MaxText does, every leaf as numpy whatever devices saved it."""
  items_path, _ = _items_and_step(items_path)
  checkpointer = ocp.PyTreeCheckpointer()
  tree = checkpointer.metadata(items_path).item_metadata.tree
  restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
  return checkpointer.restore(items_path, restore_args=restore_args)


def restore_v1(items_path: str, like: Any) -> dict[str, Any]:
  """Through v1 `load`, with `like`'s structure and every leaf requested as numpy."""
  _, step_path = _items_and_step(items_path)
  abstract = jax.tree.map(lambda _: np.ndarray, like)
  return ocp.v1.load(step_path, abstract, checkpointable_name=os.path.basename(items_path.rstrip("/")))


def restore_mesh(platform: str | None = None) -> jax.sharding.Mesh:
  """MaxText's mesh over this host's devices of `platform` (default: JAX's default backend), as MaxText builds it
  by default (ici_fsdp_parallelism=-1): every device on `fsdp`, every other axis of size 1."""
  return fsdp_mesh(jax.local_devices(backend=platform or jax.default_backend()))


def fsdp_mesh(devices: Sequence[Any]) -> jax.sharding.Mesh:
  """MaxText's default mesh over `devices`: every one on `fsdp`, every other axis of size 1."""
  shape = tuple(len(devices) if axis == "fsdp" else 1 for axis in chunking.MESH_AXES)
  return jax.sharding.Mesh(np.asarray(devices).reshape(shape), chunking.MESH_AXES)


def partition_spec(shape: Sequence[int], logical_axes: Sequence[str | None] | None,
                   mesh: jax.sharding.Mesh) -> jax.sharding.PartitionSpec:
  """Where MaxText's default rules put a leaf of `shape` whose axes are named `logical_axes` on `mesh`.

  Of the mesh axes a dimension's rule names, only those of size > 1 shard it, and each only while the dimension
  divides by their product: MaxText would refuse an uneven shard, and a restore that checks the hardware path
  must still restore every leaf. A leaf without logical axes is replicated.
  """
  if logical_axes is None:
    return jax.sharding.PartitionSpec(*(None,) * len(shape))
  if len(logical_axes) != len(shape):
    raise ValueError(f"{len(logical_axes)} logical axes {list(logical_axes)} for a leaf of shape {tuple(shape)}")
  spec = []
  for size, axes in zip(shape, chunking.mesh_axes(logical_axes)):
    kept: list[str] = []
    for axis in axes:
      if mesh.shape[axis] > 1 and size % (math.prod(mesh.shape[a] for a in kept) * mesh.shape[axis]) == 0:
        kept.append(axis)
    spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
  return jax.sharding.PartitionSpec(*spec)


def sharded_abstract_tree(items_path: str, mesh: jax.sharding.Mesh,
                          logical_axes_from: str | None = None) -> dict[str, Any]:
  """The checkpoint's tree with every array leaf a `jax.ShapeDtypeStruct` (its stored shape and dtype, sharded on
  `mesh` by the logical axes the conversion recorded, see `partition_spec`), every scalar leaf `np.ndarray`.

  A checkpoint without a record (MaxText's own) is replicated everywhere, unless `logical_axes_from` names a
  checkpoint of ours with the same leaves whose record to take: this restore checks the path from the store to the
  devices, not MaxText's naming.
  """
  items_path, _ = _items_and_step(items_path)
  recorded = ConversionRecord.read(logical_axes_from or items_path).logical_axes or {}
  tree = ocp.PyTreeCheckpointer().metadata(items_path).item_metadata.tree

  def abstract(path: tuple[Any, ...], leaf: Any) -> Any:
    if isinstance(leaf, ocp.metadata.ScalarMetadata) or not isinstance(leaf, ocp.metadata.ArrayMetadata):
      return np.ndarray
    name = leaf_name(tuple(str(getattr(k, "key", k)) for k in path))
    spec = partition_spec(leaf.shape, recorded.get(name), mesh)
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=jax.sharding.NamedSharding(mesh, spec))

  return jax.tree_util.tree_map_with_path(abstract, tree)


def restore_v0_sharded(items_path: str, abstract: Any) -> dict[str, Any]:
  """Through v0 `PyTreeCheckpointer` as MaxText restores on the hardware: every array leaf of `abstract`
  (`sharded_abstract_tree`) as a `jax.Array` with its sharding, shape and dtype; scalars as stored."""
  items_path, _ = _items_and_step(items_path)

  def restore_args(leaf: Any) -> ocp.RestoreArgs:
    if isinstance(leaf, jax.ShapeDtypeStruct):
      return ocp.ArrayRestoreArgs(sharding=leaf.sharding, global_shape=leaf.shape, dtype=leaf.dtype)
    return ocp.RestoreArgs()

  return ocp.PyTreeCheckpointer().restore(items_path, restore_args=jax.tree.map(restore_args, abstract))


def restore_v1_sharded(items_path: str, abstract: Any) -> dict[str, Any]:
  """Through v1 `load` with `abstract` (`sharded_abstract_tree`): the same leaves as `restore_v0_sharded`."""
  _, step_path = _items_and_step(items_path)
  return ocp.v1.load(step_path, abstract, checkpointable_name=storage.basename(items_path))


def saved_items(step: str) -> str:
  """The one checkpointable directory stock Orbax saved under the step directory `step` (v1 names it itself)."""
  names = [n for n in os.listdir(step) if os.path.exists(os.path.join(step, n, "_METADATA"))]
  if len(names) != 1:
    raise RuntimeError(f"{step}: expected one saved checkpointable, found {names}")
  return os.path.join(step, names[0])


def custom_metadata(items_path: str) -> dict[str, Any]:
  _, step_path = _items_and_step(items_path)
  with open(os.path.join(step_path, "_CHECKPOINT_METADATA")) as f:
    return json.load(f).get("custom_metadata") or {}


def leaf_value_types(items_path: str) -> dict[str, str]:
  """`_METADATA`'s recorded value_type per leaf key path: what a v0 reader will dispatch on."""
  with open(os.path.join(items_path, "_METADATA")) as f:
    tree_metadata = json.load(f)["tree_metadata"]
  return {key: entry["value_metadata"]["value_type"] for key, entry in tree_metadata.items()}


def flatten(tree: Any) -> dict[str, np.ndarray]:
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {jax.tree_util.keystr(path): np.asarray(value) for path, value in flat}


def trees_bit_identical(a: Any, b: Any) -> list[str]:
  """Key paths whose dtype, shape or bytes differ (empty when identical)."""
  fa, fb = flatten(a), flatten(b)
  diffs = sorted(set(fa) ^ set(fb))
  for key in sorted(set(fa) & set(fb)):
    x, y = fa[key], fb[key]
    if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
      diffs.append(key)
  return diffs


_SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": "bfloat16",
                       "F8_E4M3": "float8_e4m3fn", "I64": np.int64, "I32": np.int32, "I8": np.int8, "U8": np.uint8}


def read_safetensors_dir(model_dir: str) -> dict[str, np.ndarray]:
  """Every tensor of a directory's *.safetensors files, parsed from the format itself (bf16 and fp8 included,
  which safetensors' numpy loader cannot return)."""
  import ml_dtypes  # pylint: disable=g-import-not-at-top

  tensors: dict[str, np.ndarray] = {}
  for name in sorted(os.listdir(model_dir)):
    if not name.endswith(".safetensors"):
      continue
    with open(os.path.join(model_dir, name), "rb") as f:
      header_size = int.from_bytes(f.read(8), "little")
      header = json.loads(f.read(header_size))
      data = f.read()
    for tensor, entry in header.items():
      if tensor == "__metadata__":
        continue
      start, stop = entry["data_offsets"]
      kind = _SAFETENSORS_DTYPES[entry["dtype"]]
      dtype = np.dtype(getattr(ml_dtypes, kind) if isinstance(kind, str) else kind)
      tensors[tensor] = np.frombuffer(data[start:stop], dtype).reshape(entry["shape"])
  return tensors
