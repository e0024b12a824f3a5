"""Writes a plan as a MaxText-ready Orbax checkpoint through the v1 API, and nothing half-done on failure."""

from __future__ import annotations

import glob
import os
import shutil
from typing import Any, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp

from converter.errors import ConversionError
from converter.plan import Leaf, Plan
from handlers import ITEMS, LazyTensor, LazyTensorLoadError, lazy_tensor_context

STEP = 0


def step_dir(output_dir: str) -> str:
  return os.path.join(output_dir, str(STEP))


def _remove_unfinished(output_dir: str) -> None:
  """Orbax writes into `<step>.orbax-checkpoint-tmp*` and renames on commit; drop what a failed save left."""
  for path in glob.glob(os.path.join(output_dir, f"{STEP}.orbax-checkpoint-tmp*")):
    shutil.rmtree(path, ignore_errors=True)


def prepare_output_dir(output_dir: str, overwrite: bool) -> None:
  existing = step_dir(output_dir)
  if os.path.exists(existing):
    if not overwrite:
      raise ConversionError(f"{existing}: a checkpoint already exists here; pass --overwrite to replace it")
    shutil.rmtree(existing)
  _remove_unfinished(output_dir)
  try:
    os.makedirs(output_dir, exist_ok=True)
  except OSError as e:
    raise ConversionError(f"{output_dir}: cannot create output directory: {e}") from e
  if not os.access(output_dir, os.W_OK):
    raise ConversionError(f"{output_dir}: output directory is not writable")


def _sharding_for(shape: tuple[int, ...], mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
  """Shards the first axis the device count divides; replicates leaves no axis of which it divides."""
  spec: list[Any] = [None] * len(shape)
  for axis, size in enumerate(shape):
    if size % mesh.size == 0:
      spec[axis] = "devices"
      break
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))


def _lazy_tensor(leaf: Leaf) -> LazyTensor:
  sources = ", ".join(leaf.sources[:3]) + (" ..." if len(leaf.sources) > 3 else "")
  return LazyTensor(f"{leaf.name} (from {sources})", leaf.shape, leaf.dtype, leaf.loader)


def leaf_values(plan: Plan, *, lazy: bool, devices: int) -> dict[str, Any]:
  """The tree Orbax receives: LazyTensors (lazy, 1 device), ndarrays (eager, 1 device) or sharded jax.Arrays."""
  if devices == 1:
    return plan.tree(_lazy_tensor if lazy else (lambda leaf: np.asarray(_lazy_tensor(leaf))))
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("devices",))
  return plan.tree(lambda leaf: jax.device_put(np.asarray(_lazy_tensor(leaf)), _sharding_for(leaf.shape, mesh)))


def save(
    plan: Plan,
    output_dir: str,
    *,
    lazy: bool,
    devices: int,
    max_inflight_bytes: int,
    custom_metadata: Mapping[str, Any],
) -> str:
  """Saves `plan` as step 0 of `output_dir`; returns the items path MaxText loads."""
  try:
    tree = leaf_values(plan, lazy=lazy, devices=devices)
    checkpointer = ocp.v1.training.Checkpointer(output_dir, context=lazy_tensor_context(max_inflight_bytes))
    try:
      checkpointer.save_checkpointables(STEP, {ITEMS: tree}, custom_metadata=dict(custom_metadata))
    finally:
      checkpointer.close()
  except LazyTensorLoadError as e:
    _remove_unfinished(output_dir)
    raise ConversionError(str(e)) from e
  except OSError as e:
    _remove_unfinished(output_dir)
    raise ConversionError(f"{output_dir}: writing the checkpoint failed: {e}") from e
  except BaseException:
    _remove_unfinished(output_dir)
    raise
  return os.path.join(step_dir(output_dir), ITEMS)
