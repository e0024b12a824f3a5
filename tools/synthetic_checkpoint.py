"""Writes a large synthetic HF checkpoint of a given family and size quickly, with numpy (no torch).

For benchmarks and kill/resume tests: the values are random finite bfloat16 (or float32) numbers, the names,
shapes and config.json are those of a real model of the family, and shards are written one tensor at a time
so generating 30 GB needs little memory.
"""

from __future__ import annotations

import json
import os
from typing import Iterator

import ml_dtypes
import numpy as np

from tools.safetensors_writer import safetensors_header

_POOL_VALUES = 1 << 27  # 128 Mi gaussian values, sliced at random offsets for every tensor.


def qwen3_moe_config(*, hidden: int, layers: int, experts: int, moe_dim: int, heads: int, kv_heads: int,
                     head_dim: int, vocab: int) -> dict:
  return {
      "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": hidden,
      "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
      "head_dim": head_dim, "intermediate_size": moe_dim * 4, "moe_intermediate_size": moe_dim,
      "num_experts": experts, "num_experts_per_tok": 8 if experts >= 8 else 2, "norm_topk_prob": True,
      "vocab_size": vocab, "rms_norm_eps": 1e-6, "rope_theta": 1e7, "tie_word_embeddings": False,
      "decoder_sparse_step": 1, "mlp_only_layers": [], "torch_dtype": "bfloat16",
  }


def qwen3_moe_for_bytes(target_bytes: int, itemsize: int = 2) -> dict:
  """A Qwen3-30B-A3B-shaped config (hidden 2048, 128 experts of 768) with as many layers as fit the size."""
  hidden, experts, moe_dim, heads, kv_heads, head_dim, vocab = 2048, 128, 768, 32, 4, 128, 151936
  per_layer = (experts * 3 * hidden * moe_dim + experts * hidden + hidden * head_dim * (2 * heads + 2 * kv_heads)
               + 2 * hidden + 2 * head_dim) * itemsize
  fixed = 2 * vocab * hidden * itemsize
  layers = max(1, round((target_bytes - fixed) / per_layer))
  return qwen3_moe_config(hidden=hidden, layers=layers, experts=experts, moe_dim=moe_dim, heads=heads,
                          kv_heads=kv_heads, head_dim=head_dim, vocab=vocab)


def _decoder_shapes(config: dict, mlp) -> Iterator[tuple[str, tuple[int, ...]]]:
  """Embeddings, norms and attention of a Llama-style decoder; `mlp(prefix)` yields each layer's MLP."""
  E, H, KV, D = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
  V = config["vocab_size"]
  yield "model.embed_tokens.weight", (V, E)
  for i in range(config["num_hidden_layers"]):
    p = f"model.layers.{i}"
    yield f"{p}.input_layernorm.weight", (E,)
    yield f"{p}.post_attention_layernorm.weight", (E,)
    yield f"{p}.self_attn.q_proj.weight", (H * D, E)
    yield f"{p}.self_attn.k_proj.weight", (KV * D, E)
    yield f"{p}.self_attn.v_proj.weight", (KV * D, E)
    yield f"{p}.self_attn.o_proj.weight", (E, H * D)
    yield from mlp(p)
  yield "model.norm.weight", (E,)
  yield "lm_head.weight", (V, E)


def qwen3_moe_shapes(config: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
  E, D, X, M = config["hidden_size"], config["head_dim"], config["num_experts"], config["moe_intermediate_size"]

  def moe(p: str) -> Iterator[tuple[str, tuple[int, ...]]]:
    yield f"{p}.self_attn.q_norm.weight", (D,)
    yield f"{p}.self_attn.k_norm.weight", (D,)
    yield f"{p}.mlp.gate.weight", (X, E)
    for e in range(X):
      yield f"{p}.mlp.experts.{e}.gate_proj.weight", (M, E)
      yield f"{p}.mlp.experts.{e}.up_proj.weight", (M, E)
      yield f"{p}.mlp.experts.{e}.down_proj.weight", (E, M)

  return _decoder_shapes(config, moe)


class _GaussianPool:
  """Gaussian values like real weights (compressors see realistic data), generated once and sliced.

  Drawing fresh normals for 30 GB would take minutes; a 128 Mi-value pool read at random offsets keeps every
  tensor different from its neighbours (and from any compressor window) at disk speed.
  """

  def __init__(self, rng: np.random.Generator, dtype: np.dtype):
    self._rng = rng
    pool = (rng.standard_normal(_POOL_VALUES, dtype=np.float32) * np.float32(0.02)).astype(dtype)
    self._pool = np.concatenate([pool, pool])  # Any window up to the pool's length is one slice.

  def values(self, count: int) -> Iterator[np.ndarray]:
    while count:
      take = min(count, _POOL_VALUES)
      start = int(self._rng.integers(0, _POOL_VALUES))
      yield self._pool[start : start + take]
      count -= take


def write_checkpoint(output_dir: str, config: dict, shapes: list[tuple[str, tuple[int, ...]]], *,
                     dtype=ml_dtypes.bfloat16, max_shard_bytes: int = 4 << 30, seed: int = 0) -> int:
  """Writes config.json, shards and the index; returns the bytes of tensor data written."""
  dtype = np.dtype(dtype)
  os.makedirs(output_dir, exist_ok=True)
  shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
  size = 0
  for name, shape in shapes:
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if shards[-1] and size + nbytes > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append((name, shape))
    size += nbytes
  pool = _GaussianPool(np.random.default_rng(seed), dtype)
  weight_map, total = {}, 0
  for k, shard in enumerate(shards):
    file_name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
    placeholders = {n: np.lib.stride_tricks.as_strided(np.zeros(1, dtype), s, [0] * len(s)) for n, s in shard}
    with open(os.path.join(output_dir, file_name), "wb") as f:
      f.write(safetensors_header(placeholders))
      for name, shape in shard:
        for piece in pool.values(int(np.prod(shape))):
          f.write(piece.tobytes())
        weight_map[name] = file_name
        total += int(np.prod(shape)) * dtype.itemsize
  with open(os.path.join(output_dir, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
  with open(os.path.join(output_dir, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
  return total


def llama_config(*, hidden: int, layers: int, intermediate: int, heads: int, kv_heads: int, vocab: int) -> dict:
  return {
      "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
      "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
      "head_dim": hidden // heads, "intermediate_size": intermediate, "vocab_size": vocab, "rms_norm_eps": 1e-5,
      "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
      "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192},
  }


def llama_for_bytes(target_bytes: int, itemsize: int = 2) -> dict:
  """A Llama-3.1-8B-shaped config (hidden 4096, GQA 32:8, MLP 14336) with as many layers as fit the size."""
  hidden, intermediate, heads, kv_heads, vocab = 4096, 14336, 32, 8, 128256
  head_dim = hidden // heads
  per_layer = (hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * intermediate + 2 * hidden) * itemsize
  layers = max(1, round((target_bytes - 2 * vocab * hidden * itemsize) / per_layer))
  return llama_config(hidden=hidden, layers=layers, intermediate=intermediate, heads=heads, kv_heads=kv_heads,
                      vocab=vocab)


def llama_shapes(config: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
  E, M = config["hidden_size"], config["intermediate_size"]

  def mlp(p: str) -> Iterator[tuple[str, tuple[int, ...]]]:
    yield f"{p}.mlp.gate_proj.weight", (M, E)
    yield f"{p}.mlp.up_proj.weight", (M, E)
    yield f"{p}.mlp.down_proj.weight", (E, M)

  return _decoder_shapes(config, mlp)


FAMILIES = {
    "qwen3_moe": (qwen3_moe_for_bytes, qwen3_moe_shapes),
    "llama": (llama_for_bytes, llama_shapes),
}


def write_family_checkpoint(output_dir: str, family: str, target_bytes: int, *, seed: int = 0) -> tuple[dict, int]:
  """A synthetic `family` checkpoint of about `target_bytes` (bfloat16); returns its config and exact size."""
  for_bytes, shapes = FAMILIES[family]
  config = for_bytes(target_bytes)
  return config, write_checkpoint(output_dir, config, list(shapes(config)), seed=seed)
