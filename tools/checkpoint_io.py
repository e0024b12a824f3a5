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
