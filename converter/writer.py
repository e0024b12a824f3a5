"""Writes a plan as a MaxText-ready Orbax checkpoint through the v1 API, and nothing half-done on failure."""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Callable, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp

from converter import orbax_layout, storage
from converter.errors import ConversionError
from converter.plan import Leaf, Plan
from converter.write_behind import WriteBehindDirectory
from absl import logging

from handlers import (
    ITEMS,
    BlockWritten,
    LazyTensor,
    LazyTensorLoadError,
    LazyTensorWriteError,
    Processes,
    SaveCancelled,
    ShardedLazyTensor,
    WriteOptions,
    add_tensorstore_resources,
    brief_error,
    lazy_tensor_context,
    unhandled_leaves,
)

STEP = orbax_layout.STEP


def step_dir(output_dir: str) -> str:
  return orbax_layout.step_path(output_dir)


def _remove_unfinished(output_dir: str) -> None:
  """Drops what a failed save left (never a loadable checkpoint: uncommitted)."""
  for path in orbax_layout.unfinished_paths(output_dir):
    storage.remove_tree(path)


def prepare_output_dir(output_dir: str, overwrite: bool, *, keep_unfinished: bool = False) -> None:
  """Refuses (or with `overwrite` removes) an existing step; drops a dead run's leftovers unless kept for resume."""
  storage.make_dirs(output_dir)
  existing = step_dir(output_dir)
  if orbax_layout.is_committed(output_dir):
    if not overwrite:
      raise ConversionError(f"{existing}: a checkpoint already exists here; pass --overwrite to replace it")
    storage.remove_tree(existing)
  if not keep_unfinished:
    _remove_unfinished(output_dir)
  if not storage.is_remote(output_dir) and not os.access(output_dir, os.W_OK):
    raise ConversionError(f"{output_dir}: output directory is not writable")


def _sharding_for(shape: tuple[int, ...], mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
  """Shards the first axis the device count divides; replicates leaves no axis of which it divides."""
  spec: list[Any] = [None] * len(shape)
  for axis, size in enumerate(shape):
    if size % mesh.size == 0:
      spec[axis] = "devices"
      break
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))


def _leaf_name(leaf: Leaf) -> str:
  sources = ", ".join(leaf.sources[:3]) + (" ..." if len(leaf.sources) > 3 else "")
  return f"{leaf.name} (from {sources})"


def leaf_values(plan: Plan, *, lazy: bool, devices: int, processes: Processes = Processes()) -> dict[str, Any]:
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
    if lazy:
      return plan.tree(lambda leaf: LazyTensor(_leaf_name(leaf), leaf.shape, leaf.dtype, leaf.loader))
    return plan.tree(lambda leaf: LazyTensor(_leaf_name(leaf), leaf.shape, leaf.dtype, leaf.loader).materialize())
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("devices",))

  def sharded(leaf: Leaf) -> Any:
    value = ShardedLazyTensor(_leaf_name(leaf), leaf.shape, leaf.dtype, leaf.loader, _sharding_for(leaf.shape, mesh))
    return value if lazy else jax.device_put(value.materialize(), value.sharding)

  return plan.tree(sharded)


def save(
    plan: Plan,
    output_dir: str,
    *,
    lazy: bool,
    devices: int,
    max_inflight_bytes: int,
    custom_metadata: Mapping[str, Any],
    on_block_written: Callable[[BlockWritten], None] | None = None,
    keep_unfinished: bool = False,
    cancel: threading.Event | None = None,
    processes: Processes = Processes(),
    compression: bool = True,
) -> str:
  """Saves `plan` as step 0 of `output_dir`; returns the items path MaxText loads.

  On failure Orbax's temporary directory (never a loadable checkpoint) is deleted, unless `keep_unfinished`:
  then the caller parks it for a resumed run.
  """
  try:
    tree = leaf_values(plan, lazy=lazy, devices=devices, processes=processes)
    unhandled = unhandled_leaves(tree)
    if unhandled:
      raise ConversionError(f"{output_dir}: no Orbax leaf handler for: {'; '.join(unhandled[:5])}")
    add_tensorstore_resources(storage.tensorstore_resources())
    options = WriteOptions(max_inflight_bytes=max_inflight_bytes, on_block_written=on_block_written, cancel=cancel,
                           processes=processes, compression=compression)
    checkpointer = ocp.v1.training.Checkpointer(storage.epath_of(output_dir), context=lazy_tensor_context(options))
    behind = contextlib.nullcontext() if storage.is_remote(output_dir) else WriteBehindDirectory(output_dir)
    try:
      with behind:
        checkpointer.save_checkpointables(STEP, {ITEMS: tree}, custom_metadata=dict(custom_metadata))
    finally:
      checkpointer.close()
  except BaseException as e:
    if not keep_unfinished and processes.is_primary:
      _remove_unfinished(output_dir)
    if isinstance(e, (ConversionError, KeyboardInterrupt, SystemExit)):
      raise
    logging.vlog(1, "save failed", exc_info=True)
    if isinstance(e, SaveCancelled) or (cancel is not None and cancel.is_set()):
      raise ConversionError(f"{output_dir}: interrupted") from e
    if isinstance(e, (LazyTensorLoadError, LazyTensorWriteError)):
      raise ConversionError(f"{output_dir}: {e}") from e
    raise ConversionError(
        f"{output_dir}: writing the checkpoint failed ({brief_error(e)}) (run with -v=1 for the full traceback)"
    ) from e
  return orbax_layout.items_path(output_dir)
