"""Reads a converted checkpoint back as numpy, through Orbax v0 and v1, on any device count."""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


def _items_and_step(items_path: str) -> tuple[str, str]:
  items_path = os.path.abspath(items_path.rstrip("/"))
  return items_path, os.path.dirname(items_path)


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
