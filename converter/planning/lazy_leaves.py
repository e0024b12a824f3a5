"""A plan's leaves as the handlers' lazy tensors: what the Orbax writer saves, `--verify` compares, `--dry_run`
sizes and the early reads read first, built in one place so that all of them cut every leaf into the same
blocks. Only the tree Orbax receives needs JAX."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from converter.errors import ConversionError
from converter.planning.plan import Leaf, Plan
from handlers.blocks import block_target_bytes, plan_blocks, write_order
from handlers.early_reads import EarlyReads
from handlers.lazy_tensor import LazyTensor, ShardedLazyTensor
from handlers.shares import Processes

if TYPE_CHECKING:
  import jax


def _described(leaf: Leaf) -> str:
  """The leaf's name with its first sources: what an error while reading or writing it says."""
  sources = ", ".join(leaf.sources[:3]) + (" ..." if len(leaf.sources) > 3 else "")
  return f"{leaf.name} (from {sources})"


def lazy_tensor(leaf: Leaf) -> LazyTensor:
  return LazyTensor(_described(leaf), leaf.shape, leaf.dtype, leaf.loader, leaf.chunk_shape, leaf.chunk_order,
                    leaf.element_order, leaf.host_shape)


def _sharded_lazy_tensor(leaf: Leaf, sharding: Any) -> ShardedLazyTensor:
  """`leaf` over devices: `sharding` is a JAX sharding, or `_DeviceShards` where only the block cut asks for it."""
  return ShardedLazyTensor(_described(leaf), leaf.shape, leaf.dtype, leaf.loader, sharding, leaf.chunk_shape,
                           leaf.chunk_order, leaf.element_order, leaf.host_shape)


def write_blocks(plan: Plan, max_inflight_bytes: int):
  """Every leaf's lazy tensor, and the writer's cut of them under this budget (handlers.blocks.plan_blocks:
  each leaf's block shape; every block as (leaf's position, index) and its bytes, in the order they are
  written)."""
  lazies = [lazy_tensor(leaf) for leaf in plan.leaves]
  return (lazies, *plan_blocks(lazies, block_target_bytes(max_inflight_bytes)))


def _sharded_axis(shape: tuple[int, ...], devices: int) -> int | None:
  """The first axis the device count divides; None: no axis does, and the leaf is replicated."""
  return next((axis for axis, size in enumerate(shape) if size % devices == 0), None)


def _sharding_for(shape: tuple[int, ...], mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
  import jax  # pylint: disable=g-import-not-at-top,redefined-outer-name

  spec: list[Any] = [None] * len(shape)
  axis = _sharded_axis(shape, mesh.size)
  if axis is not None:
    spec[axis] = "devices"
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))


class _DeviceShards:
  """`_sharding_for`'s shard shapes without JAX: all the writer's block cut asks of a sharding."""

  def __init__(self, devices: int):
    self._devices = devices

  def shard_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
    axis = _sharded_axis(shape, self._devices)
    return tuple(size // self._devices if a == axis else size for a, size in enumerate(shape))


def in_writing_order(plan: Plan) -> list[Leaf]:
  """The leaves in the order the writer writes them (`handlers.blocks.write_order` of the order Orbax hands them
  over: its tree's, keys sorted at every level)."""
  tree_order = sorted(plan.leaves, key=lambda leaf: leaf.path)
  return [tree_order[i] for i in write_order([leaf.nbytes for leaf in tree_order])]


def read_early(plan: Plan, *, devices: int, max_inflight_bytes: int) -> EarlyReads:
  """Starts reading, on a worker thread, the blocks a one-process lazy save of `plan` on `devices` writes first,
  cut as `lazy_tree`'s leaves will be, without JAX (handlers/early_reads.py)."""
  shards = _DeviceShards(devices)
  values = [_sharded_lazy_tensor(leaf, shards) if devices > 1 else lazy_tensor(leaf)
            for leaf in in_writing_order(plan)]
  return EarlyReads(values, max_inflight_bytes)


def lazy_tree(plan: Plan, *, lazy: bool, devices: int, processes: Processes) -> dict[str, Any]:
  """The tree Orbax receives.

  Lazy: `LazyTensor`s (1 device) or `ShardedLazyTensor`s (N devices), streamed into the checkpoint block by
  block. Eager, the reference arm: every leaf materialised first, as ndarrays or sharded jax.Arrays. With several
  processes the leaves are global arrays over every process's devices, as MaxText restores them on a pod.
  """
  import jax  # pylint: disable=g-import-not-at-top,redefined-outer-name

  if processes.count > 1:
    if not lazy:
      raise ConversionError("several processes write lazily only (drop --nolazy_load_tensors)")
    devices = len(jax.devices())
  if devices == 1:
    return plan.tree(lambda leaf: lazy_tensor(leaf) if lazy else lazy_tensor(leaf).materialize())
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("devices",))

  def sharded(leaf: Leaf) -> Any:
    value = _sharded_lazy_tensor(leaf, _sharding_for(leaf.shape, mesh))
    return value if lazy else jax.device_put(value.materialize(), value.sharding)

  return plan.tree(sharded)
