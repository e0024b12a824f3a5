"""A plan's leaves as the handlers' lazy tensors: what the Orbax writer saves, `--verify` compares and `--dry_run`
sizes, built in one place so that all three cut every leaf into the same blocks."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from converter.errors import ConversionError
from converter.plan import Leaf, Plan
from handlers import LazyTensor, Processes, ShardedLazyTensor
from handlers.streaming import block_target_bytes, plan_blocks


def _described(leaf: Leaf) -> str:
  """The leaf's name with its first sources: what an error while reading or writing it says."""
  sources = ", ".join(leaf.sources[:3]) + (" ..." if len(leaf.sources) > 3 else "")
  return f"{leaf.name} (from {sources})"


def lazy_tensor(leaf: Leaf) -> LazyTensor:
  return LazyTensor(_described(leaf), leaf.shape, leaf.dtype, leaf.loader, leaf.chunk_shape)


def write_blocks(plan: Plan, max_inflight_bytes: int):
  """Every leaf's lazy tensor, and the writer's cut of them under this budget (handlers.streaming.plan_blocks:
  each leaf's block shape and block indices, and every block's bytes)."""
  lazies = [lazy_tensor(leaf) for leaf in plan.leaves]
  return (lazies, *plan_blocks(lazies, block_target_bytes(max_inflight_bytes)))


def _sharding_for(shape: tuple[int, ...], mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
  """Shards the first axis the device count divides; replicates leaves no axis of which it divides."""
  spec: list[Any] = [None] * len(shape)
  for axis, size in enumerate(shape):
    if size % mesh.size == 0:
      spec[axis] = "devices"
      break
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))


def lazy_tree(plan: Plan, *, lazy: bool, devices: int, processes: Processes) -> dict[str, Any]:
  """The tree Orbax receives.

  Lazy: `LazyTensor`s (1 device) or `ShardedLazyTensor`s (N devices), streamed into the checkpoint block by
  block. Eager, the reference arm: every leaf materialised first, as ndarrays or sharded jax.Arrays. With several
  processes the leaves are global arrays over every process's devices, as MaxText restores them on a pod.
  """
  if processes.count > 1:
    if not lazy:
      raise ConversionError("several processes write lazily only (drop --nolazy_load_tensors)")
    devices = len(jax.devices())
  if devices == 1:
    return plan.tree(lambda leaf: lazy_tensor(leaf) if lazy else lazy_tensor(leaf).materialize())
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("devices",))

  def sharded(leaf: Leaf) -> Any:
    value = ShardedLazyTensor(_described(leaf), leaf.shape, leaf.dtype, leaf.loader, _sharding_for(leaf.shape, mesh),
                              leaf.chunk_shape)
    return value if lazy else jax.device_put(value.materialize(), value.sharding)

  return plan.tree(sharded)
