"""Writes a large synthetic HF checkpoint of a given family and size quickly, with numpy (no torch).

For benchmarks and kill/resume tests: the values are random finite bfloat16 (or float32) numbers, the names,
shapes and config.json are those of a real model of the family, and shards are written one tensor at a time
so generating 30 GB needs little memory.
"""

from __future__ import annotations

import json
import math
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
  tensor different from its neighbours (and from any compressor window) at disk speed. FP8 weights are spread
  over e4m3's range as block-scaled checkpoints are; `positive` pools are scales.
  """

  def __init__(self, rng: np.random.Generator, dtype: np.dtype, positive: bool = False, std: float | None = None,
               size: int = _POOL_VALUES):
    self._rng = rng
    self._size = size  # Fewer values for a checkpoint that has fewer (tests' tiny ones).
    if dtype == np.int32:  # Packed INT4 words (compressed-tensors): every bit random, all 16 codes equally likely.
      pool = rng.integers(np.iinfo(np.int32).min, np.iinfo(np.int32).max, size, dtype=np.int32, endpoint=True)
    else:
      std = std or (2e-4 if positive else 64.0 if dtype.itemsize == 1 else 0.02)
      pool = rng.standard_normal(size, dtype=np.float32) * np.float32(std)
      pool = (np.abs(pool) + np.float32(std / 8) if positive else pool).astype(dtype)
    self._pool = np.concatenate([pool, pool])  # Any window up to the pool's length is one slice.

  def values(self, count: int) -> Iterator[np.ndarray]:
    while count:
      take = min(count, self._size)
      start = int(self._rng.integers(0, self._size))
      yield self._pool[start : start + take]
      count -= take


def write_checkpoint(output_dir: str, config: dict, shapes: list[tuple], *, dtype=ml_dtypes.bfloat16,
                     max_shard_bytes: int = 4 << 30, seed: int = 0, sparse: bool = False) -> int:
  """Writes config.json, shards and the index; returns the bytes of tensor data written. `shapes` holds
  (name, shape) in `dtype`, or (name, shape, dtype) for tensors of another dtype (FP8 weights, their scales), or
  (name, shape, dtype, values) for a tensor whose values are data, not weights (compressed-tensors'
  `weight_shape`): those are written as given, sparse or not.

  `sparse`: each shard is its header and a hole of the data's length (zeros, taking no disk): a full-size model's
  checkpoint on a small disk, for what reads headers alone (`--dry_run`)."""
  tensors = [(t[0], tuple(t[1]), np.dtype(t[2] if len(t) > 2 else dtype), t[3] if len(t) > 3 else None)
             for t in shapes]
  os.makedirs(output_dir, exist_ok=True)
  shards: list[list[tuple[str, tuple[int, ...], np.dtype, np.ndarray | None]]] = [[]]
  size = 0
  for name, shape, tensor_dtype, values in tensors:
    nbytes = int(np.prod(shape)) * tensor_dtype.itemsize
    if shards[-1] and size + nbytes > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append((name, shape, tensor_dtype, values))
    size += nbytes
  rng = np.random.default_rng(seed)
  pools: dict[tuple[np.dtype, bool, float | None], _GaussianPool] = {}
  weight_map, total = {}, 0
  for k, shard in enumerate(shards):
    file_name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
    placeholders = {n: np.lib.stride_tricks.as_strided(np.zeros(1, d), s, [0] * len(s)) for n, s, d, _ in shard}
    with open(os.path.join(output_dir, file_name), "wb") as f:
      f.write(safetensors_header(placeholders))
      offset = f.tell()
      if sparse:
        f.truncate(offset + sum(int(np.prod(s)) * d.itemsize for _, s, d, _ in shard))
      for name, shape, tensor_dtype, values in shard:
        weight_map[name] = file_name
        nbytes = int(np.prod(shape)) * tensor_dtype.itemsize
        total += nbytes
        if values is not None:  # Data the reader checks (weight_shape): written even in a sparse checkpoint.
          data = np.ascontiguousarray(values, dtype=tensor_dtype.newbyteorder("<")).tobytes()
          if len(data) != nbytes:
            raise ValueError(f"{name}: {len(data)} bytes of values for {shape} {tensor_dtype}")
          f.seek(offset)
          f.write(data)
        elif not sparse:
          # compressed-tensors' INT4 scales multiply codes of -8..7: about 2e-3 gives weights of about 0.01.
          std = 2e-3 if name.endswith(".weight_scale") else None
          kind = (tensor_dtype, name.endswith(("_scale_inv", ".scale", ".weight_scale")), std)
          if kind not in pools:
            pools[kind] = _GaussianPool(rng, tensor_dtype, positive=kind[1], std=std,
                                        size=min(_POOL_VALUES, sum(int(np.prod(t[1])) for t in tensors)))
          f.seek(offset)
          for piece in pools[kind].values(int(np.prod(shape))):
            f.write(piece.tobytes())
        offset += nbytes
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


FP8_BLOCK = 128


def deepseek3_fp8_config(*, moe_layers: int, experts: int, vocab: int) -> dict:
  """DeepSeek V3's dimensions (hidden 7168, 128 heads, MLA ranks 1536 / 512, experts of 2048, 1 shared, 1 dense
  layer first), with fewer experts, layers and vocab so that it fits a benchmark; FP8 in 128x128 blocks."""
  return {
      "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
      "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 1 + moe_layers,
      "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": experts,
      "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
      "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
      "first_k_dense_replace": 1, "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
      "moe_layer_freq": 1, "num_nextn_predict_layers": 0, "vocab_size": vocab, "rms_norm_eps": 1e-6,
      "rope_theta": 10000, "max_position_embeddings": 163840, "tie_word_embeddings": False,
      "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                       "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
      "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                              "weight_block_size": [FP8_BLOCK, FP8_BLOCK]},
      "torch_dtype": "bfloat16",
  }


def deepseek3_fp8_for_bytes(target_bytes: int, itemsize: int = 1) -> dict:
  """As many 32-expert MoE layers as fit `target_bytes` of FP8 weights (vocab 16384)."""
  del itemsize
  experts, vocab = 32, 16384
  per_moe_layer = sum(math.prod(s) for _, s, _ in _deepseek_layer(deepseek3_fp8_config(moe_layers=1, experts=experts,
                                                                                        vocab=vocab), 1))
  fixed = 2 * vocab * 7168 * 2 + sum(math.prod(s) for _, s, _ in _deepseek_layer(
      deepseek3_fp8_config(moe_layers=1, experts=experts, vocab=vocab), 0))
  return deepseek3_fp8_config(moe_layers=max(1, round((target_bytes - fixed) / per_moe_layer)), experts=experts,
                              vocab=vocab)


def _fp8(name: str, shape: tuple[int, int]) -> Iterator[tuple[str, tuple[int, ...], np.dtype]]:
  yield name, shape, np.dtype(ml_dtypes.float8_e4m3fn)
  yield name + "_scale_inv", tuple(math.ceil(d / FP8_BLOCK) for d in shape), np.dtype(np.float32)


def _deepseek_layer(config: dict, i: int) -> Iterator[tuple[str, tuple[int, ...], np.dtype]]:
  E, H, bf16 = config["hidden_size"], config["num_attention_heads"], np.dtype(ml_dtypes.bfloat16)
  q, kv, nope, rope, v = (config[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                              "v_head_dim"))
  p = f"model.layers.{i}"
  yield f"{p}.input_layernorm.weight", (E,), bf16
  yield f"{p}.post_attention_layernorm.weight", (E,), bf16
  yield from _fp8(f"{p}.self_attn.q_a_proj.weight", (q, E))
  yield f"{p}.self_attn.q_a_layernorm.weight", (q,), bf16
  yield from _fp8(f"{p}.self_attn.q_b_proj.weight", (H * (nope + rope), q))
  yield from _fp8(f"{p}.self_attn.kv_a_proj_with_mqa.weight", (kv + rope, E))
  yield f"{p}.self_attn.kv_a_layernorm.weight", (kv,), bf16
  yield from _fp8(f"{p}.self_attn.kv_b_proj.weight", (H * (nope + v), kv))
  yield from _fp8(f"{p}.self_attn.o_proj.weight", (E, H * v))
  if i < config["first_k_dense_replace"]:
    M = config["intermediate_size"]
    for proj, shape in (("gate_proj", (M, E)), ("up_proj", (M, E)), ("down_proj", (E, M))):
      yield from _fp8(f"{p}.mlp.{proj}.weight", shape)
    return
  X, M = config["n_routed_experts"], config["moe_intermediate_size"]
  yield f"{p}.mlp.gate.weight", (X, E), bf16
  yield f"{p}.mlp.gate.e_score_correction_bias", (X,), np.dtype(np.float32)
  for expert in [f"experts.{e}" for e in range(X)] + ["shared_experts"]:
    for proj, shape in (("gate_proj", (M, E)), ("up_proj", (M, E)), ("down_proj", (E, M))):
      yield from _fp8(f"{p}.mlp.{expert}.{proj}.weight", shape)


def deepseek3_full_config() -> dict:
  """DeepSeek-V3 as the hub ships it: 61 layers (3 dense), 256 experts, vocab 129280, and its multi-token
  prediction layer (model.layers.61)."""
  config = deepseek3_fp8_config(moe_layers=60, experts=256, vocab=129280)  # 61 layers.
  return {**config, "first_k_dense_replace": 3, "num_nextn_predict_layers": 1}


def deepseek3_fp8_shapes(config: dict) -> Iterator[tuple[str, tuple[int, ...], np.dtype]]:
  bf16 = np.dtype(ml_dtypes.bfloat16)
  E, V = config["hidden_size"], config["vocab_size"]
  yield "model.embed_tokens.weight", (V, E), bf16
  for i in range(config["num_hidden_layers"]):
    yield from _deepseek_layer(config, i)
  for i in range(config["num_hidden_layers"], config["num_hidden_layers"] + config["num_nextn_predict_layers"]):
    yield from _deepseek_layer(config, i)  # A multi-token-prediction layer: a MoE layer and its own head.
    p = f"model.layers.{i}"
    yield from ((f"{p}.embed_tokens.weight", (V, E), bf16), (f"{p}.enorm.weight", (E,), bf16),
                (f"{p}.hnorm.weight", (E,), bf16), (f"{p}.eh_proj.weight", (E, 2 * E), bf16),
                (f"{p}.shared_head.norm.weight", (E,), bf16), (f"{p}.shared_head.head.weight", (V, E), bf16))
  yield "model.norm.weight", (config["hidden_size"],), bf16
  yield "lm_head.weight", (config["vocab_size"], config["hidden_size"]), bf16


# Qwen3.5-35B-A3B's vision tower (hub config.json), which its FP8 repo ships unquantized in BF16.
_QWEN3_5_VISION = {"model_type": "qwen3_5_moe", "depth": 27, "hidden_size": 1152, "hidden_act": "gelu_pytorch_tanh",
                   "in_channels": 3, "intermediate_size": 4304, "num_heads": 16, "num_position_embeddings": 2304,
                   "out_hidden_size": 2048, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2}


def qwen3_5_fp8_config(*, cycles: int, experts: int, vocab: int) -> dict:
  """Qwen3.5-35B-A3B-FP8 as the hub ships it (the multimodal wrapper, text config nested, FP8 in 128x128 blocks
  with BF16 scales, experts one by one, the vision tower in BF16): hidden 2048, 16 heads of 256 (2 KV), linear
  attention of 16 key and 32 value heads of 128, experts of 512; fewer experts, layers (whole cycles of 3 linear + 1
  full) and vocab."""
  text = {
      "model_type": "qwen3_5_moe_text", "hidden_size": 2048, "num_hidden_layers": 4 * cycles,
      "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "moe_intermediate_size": 512,
      "shared_expert_intermediate_size": 512, "num_experts": experts, "num_experts_per_tok": 8,
      "norm_topk_prob": True, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
      "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
      "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * cycles,
      "vocab_size": vocab, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "tie_word_embeddings": False,
      "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                          "mrope_section": [11, 11, 10]},
  }
  return {
      "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe", "text_config": text,
      "vision_config": dict(_QWEN3_5_VISION), "image_token_id": 248056, "vision_start_token_id": 248053,
      "tie_word_embeddings": False, "torch_dtype": "bfloat16",
      "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                              "weight_block_size": [FP8_BLOCK, FP8_BLOCK]},
  }


def qwen3_5_fp8_for_bytes(target_bytes: int, itemsize: int = 1) -> dict:
  """As many 4-layer cycles of 64-expert layers as fit `target_bytes` of FP8 weights (vocab 16384)."""
  del itemsize
  experts, vocab = 64, 16384
  one = qwen3_5_fp8_config(cycles=1, experts=experts, vocab=vocab)
  per_cycle = sum(math.prod(s) * np.dtype(d).itemsize for i in range(4) for _, s, d in _qwen3_5_layer(one, i))
  tower = sum(math.prod(s) * np.dtype(d).itemsize for _, s, d in _qwen3_5_vision(one))
  return qwen3_5_fp8_config(cycles=max(1, round((target_bytes - 2 * vocab * 2048 * 2 - tower) / per_cycle)),
                            experts=experts, vocab=vocab)


def _vit_blocks(prefix: str, depth: int, hidden: int, norms: tuple[str, str],
                linears) -> Iterator[tuple[str, tuple[int, ...], np.dtype]]:
  """A vision transformer's blocks in BF16: two layer norms and (name, out, in) linears, each with its bias."""
  bf16 = np.dtype(ml_dtypes.bfloat16)
  for i in range(depth):
    for norm in norms:
      yield f"{prefix}.{i}.{norm}.weight", (hidden,), bf16
      yield f"{prefix}.{i}.{norm}.bias", (hidden,), bf16
    for name, out, fan_in in linears:
      yield f"{prefix}.{i}.{name}.weight", (out, fan_in), bf16
      yield f"{prefix}.{i}.{name}.bias", (out,), bf16


def _qwen3_5_vision(config: dict) -> Iterator[tuple[str, tuple[int, ...], np.dtype]]:
  """The vision tower's tensors under `model.visual.`, all BF16: patch embedding, position table, blocks, merger."""
  v, bf16 = config["vision_config"], np.dtype(ml_dtypes.bfloat16)
  D, I, p, tp = v["hidden_size"], v["intermediate_size"], v["patch_size"], v["temporal_patch_size"]
  merged = D * v["spatial_merge_size"] ** 2
  yield "model.visual.patch_embed.proj.weight", (D, v["in_channels"], tp, p, p), bf16
  yield "model.visual.patch_embed.proj.bias", (D,), bf16
  yield "model.visual.pos_embed.weight", (v["num_position_embeddings"], D), bf16
  linears = [("attn.qkv", 3 * D, D), ("attn.proj", D, D), ("mlp.linear_fc1", I, D), ("mlp.linear_fc2", D, I)]
  yield from _vit_blocks("model.visual.blocks", v["depth"], D, ("norm1", "norm2"), linears)
  yield "model.visual.merger.norm.weight", (D,), bf16
  yield "model.visual.merger.norm.bias", (D,), bf16
  for name, out, fan_in in (("linear_fc1", merged, merged), ("linear_fc2", v["out_hidden_size"], merged)):
    yield f"model.visual.merger.{name}.weight", (out, fan_in), bf16
    yield f"model.visual.merger.{name}.bias", (out,), bf16


def _fp8_bf16_scales(name: str, shape: tuple[int, int]) -> Iterator[tuple[str, tuple[int, ...], np.dtype]]:
  yield name, shape, np.dtype(ml_dtypes.float8_e4m3fn)
  yield name + "_scale_inv", tuple(math.ceil(d / FP8_BLOCK) for d in shape), np.dtype(ml_dtypes.bfloat16)


def _qwen3_5_layer(config: dict, i: int) -> Iterator[tuple[str, tuple[int, ...], np.dtype]]:
  t, bf16 = config["text_config"], np.dtype(ml_dtypes.bfloat16)
  E, M, X = t["hidden_size"], t["moe_intermediate_size"], t["num_experts"]
  p = f"model.language_model.layers.{i}"
  yield f"{p}.input_layernorm.weight", (E,), bf16
  yield f"{p}.post_attention_layernorm.weight", (E,), bf16
  if t["layer_types"][i] == "full_attention":
    H, KV, D = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    for proj, shape in (("q_proj", (2 * H * D, E)), ("k_proj", (KV * D, E)), ("v_proj", (KV * D, E)),
                        ("o_proj", (E, H * D))):
      yield from _fp8_bf16_scales(f"{p}.self_attn.{proj}.weight", shape)
    yield f"{p}.self_attn.q_norm.weight", (D,), bf16
    yield f"{p}.self_attn.k_norm.weight", (D,), bf16
  else:
    Hk, Hv, Dk, Dv = (t[k] for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                    "linear_value_head_dim"))
    a = f"{p}.linear_attn"
    yield from _fp8_bf16_scales(f"{a}.in_proj_qkv.weight", (2 * Hk * Dk + Hv * Dv, E))
    yield from _fp8_bf16_scales(f"{a}.in_proj_z.weight", (Hv * Dv, E))
    yield from _fp8_bf16_scales(f"{a}.out_proj.weight", (E, Hv * Dv))
    yield f"{a}.in_proj_b.weight", (Hv, E), bf16
    yield f"{a}.in_proj_a.weight", (Hv, E), bf16
    yield f"{a}.conv1d.weight", (2 * Hk * Dk + Hv * Dv, 1, t["linear_conv_kernel_dim"]), bf16
    yield f"{a}.A_log", (Hv,), np.dtype(np.float32)
    yield f"{a}.dt_bias", (Hv,), bf16
    yield f"{a}.norm.weight", (Dv,), np.dtype(np.float32)
  yield f"{p}.mlp.gate.weight", (X, E), bf16
  yield f"{p}.mlp.shared_expert_gate.weight", (1, E), bf16
  for expert in [f"experts.{e}" for e in range(X)] + ["shared_expert"]:
    for proj, shape in (("gate_proj", (M, E)), ("up_proj", (M, E)), ("down_proj", (E, M))):
      yield from _fp8_bf16_scales(f"{p}.mlp.{expert}.{proj}.weight", shape)


def qwen3_5_fp8_shapes(config: dict) -> Iterator[tuple[str, tuple[int, ...], np.dtype]]:
  t, bf16 = config["text_config"], np.dtype(ml_dtypes.bfloat16)
  yield "model.language_model.embed_tokens.weight", (t["vocab_size"], t["hidden_size"]), bf16
  for i in range(t["num_hidden_layers"]):
    yield from _qwen3_5_layer(config, i)
  yield "model.language_model.norm.weight", (t["hidden_size"],), bf16
  yield "lm_head.weight", (t["vocab_size"], t["hidden_size"]), bf16
  yield from _qwen3_5_vision(config)


def deepseek4_config(*, layers: int = 43, experts: int = 256, vocab: int = 129280, expert_dtype: str = "fp4") -> dict:
  """DeepSeek-V4-Flash's config.json as the hub ships it (hub keys, FP8 in 128x128 blocks with E8M0 scales, routed
  experts in FP4, one MTP block), with `layers`, `experts` and `vocab` to make it smaller: 3 hash-routed layers
  (ratios 0, 0, 4), then ratio 128 and 4 alternating, as MaxText's scanned blocks need."""
  return {
      "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "hidden_size": 4096,
      "num_hidden_layers": layers, "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
      "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024, "n_routed_experts": experts,
      "n_shared_experts": 1, "num_experts_per_tok": 6, "moe_intermediate_size": 2048, "vocab_size": vocab,
      "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "num_hash_layers": 3,
      "compress_ratios": [0, 0, 4] + [128, 4] * ((layers - 3) // 2) + [0], "index_n_heads": 64,
      "index_head_dim": 128, "index_topk": 512, "sliding_window": 128, "rope_theta": 10000,
      "compress_rope_theta": 160000, "rope_scaling": {"type": "yarn", "factor": 16,
                                                      "original_max_position_embeddings": 65536, "beta_fast": 32,
                                                      "beta_slow": 1},
      "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
      "norm_topk_prob": True, "num_nextn_predict_layers": 1, "rms_norm_eps": 1e-6, "max_position_embeddings": 1048576,
      "tie_word_embeddings": False, "torch_dtype": "bfloat16", "expert_dtype": expert_dtype,
      "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                              "activation_scheme": "dynamic", "weight_block_size": [FP8_BLOCK, FP8_BLOCK]},
  }


def deepseek4_for_bytes(target_bytes: int, itemsize: int = 1) -> dict:
  """DeepSeek-V4-Flash's shapes with 8 experts a layer (a conversion writes 4x the FP4 bytes: the disk must hold
  the output and MaxText's route's bfloat16 copy) and vocab 16384: 3 hash layers + as many (128, 4) pairs as
  fit."""
  del itemsize
  experts, vocab = 8, 16384
  one = deepseek4_config(layers=5, experts=experts, vocab=vocab)
  per_pair = sum(tensor_bytes(t) for i in (3, 4) for t in _deepseek4_layer(one, f"layers.{i}", i))
  fixed = sum(tensor_bytes(t) for t in deepseek4_shapes(one)) - 2 * per_pair
  return deepseek4_config(layers=3 + 2 * max(1, round((target_bytes - fixed) / per_pair)), experts=experts,
                          vocab=vocab)


def tensor_bytes(tensor: tuple[str, tuple[int, ...], np.dtype]) -> int:
  return math.prod(tensor[1]) * np.dtype(tensor[2]).itemsize


def _fp8_e8m0(name: str, shape: tuple[int, ...]) -> Iterator[tuple[str, tuple[int, ...], np.dtype]]:
  """An FP8 weight `<module>.weight` and its power-of-two block scales `<module>.scale`, as V4 names them."""
  yield name, shape, np.dtype(ml_dtypes.float8_e4m3fn)
  yield name.removesuffix(".weight") + ".scale", tuple(math.ceil(d / FP8_BLOCK) for d in shape), np.dtype(
      ml_dtypes.float8_e8m0fnu)


def _fp4_e2m1(name: str, shape: tuple[int, int]) -> Iterator[tuple[str, tuple[int, ...], np.dtype]]:
  """A routed expert's (out, in) weight packed as V4 ships it: I8 (out, in / 2) and E8M0 scales (out, in / 32)."""
  yield name, (shape[0], shape[1] // 2), np.dtype(np.int8)
  yield name.removesuffix(".weight") + ".scale", (shape[0], shape[1] // 32), np.dtype(ml_dtypes.float8_e8m0fnu)


def _deepseek4_layer(config: dict, p: str, i: int) -> Iterator[tuple[str, tuple[int, ...], np.dtype]]:
  """One V4 layer's hub tensors under `p` (`layers.{i}`, or the MTP block's): mixers and sinks F32, projections
  FP8, compressors and the router BF16, routed experts FP4 (or FP8 for -Base)."""
  E, H, D, q, G, o = (config[k] for k in ("hidden_size", "num_attention_heads", "head_dim", "q_lora_rank",
                                          "o_groups", "o_lora_rank"))
  N, X, M, Hi, Di = (config[k] for k in ("hc_mult", "n_routed_experts", "moe_intermediate_size", "index_n_heads",
                                         "index_head_dim"))
  bf16, f32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)
  ratio = config["compress_ratios"][i]
  for norm in ("attn_norm", "ffn_norm"):
    yield f"{p}.{norm}.weight", (E,), bf16
  for mixer in ("hc_attn", "hc_ffn"):
    yield f"{p}.{mixer}_fn", ((2 + N) * N, N * E), f32
    yield f"{p}.{mixer}_base", ((2 + N) * N,), f32
    yield f"{p}.{mixer}_scale", (3,), f32
  a = f"{p}.attn"
  yield from _fp8_e8m0(f"{a}.wq_a.weight", (q, E))
  yield f"{a}.q_norm.weight", (q,), bf16
  yield from _fp8_e8m0(f"{a}.wq_b.weight", (H * D, q))
  yield from _fp8_e8m0(f"{a}.wkv.weight", (D, E))
  yield f"{a}.kv_norm.weight", (D,), bf16
  yield from _fp8_e8m0(f"{a}.wo_a.weight", (G * o, H * D // G))
  yield from _fp8_e8m0(f"{a}.wo_b.weight", (E, G * o))
  yield f"{a}.attn_sink", (H,), f32
  compressors = [(f"{a}.compressor", D)] + ([(f"{a}.indexer.compressor", Di)] if ratio == 4 else [])
  for c, width in compressors if ratio else ():
    wide = 2 * width if ratio == 4 else width  # CSA pools overlapping windows.
    yield f"{c}.wkv.weight", (wide, E), bf16
    yield f"{c}.wgate.weight", (wide, E), bf16
    yield f"{c}.ape", (ratio, wide), f32
    yield f"{c}.norm.weight", (width,), bf16
  if ratio == 4:
    yield from _fp8_e8m0(f"{a}.indexer.wq_b.weight", (Hi * Di, q))
    yield f"{a}.indexer.weights_proj.weight", (Hi, E), bf16
  f = f"{p}.ffn"
  yield f"{f}.gate.weight", (X, E), bf16
  if p.startswith("layers.") and i < config["num_hash_layers"]:
    yield f"{f}.gate.tid2eid", (config["vocab_size"], config["num_experts_per_tok"]), np.dtype(np.int64)
  else:
    yield f"{f}.gate.bias", (X,), f32
  for proj, shape in (("w1", (M, E)), ("w2", (E, M)), ("w3", (M, E))):
    yield from _fp8_e8m0(f"{f}.shared_experts.{proj}.weight", shape)
  routed = _fp4_e2m1 if config["expert_dtype"] == "fp4" else _fp8_e8m0
  for e in range(X):
    for proj, shape in (("w1", (M, E)), ("w2", (E, M)), ("w3", (M, E))):
      yield from routed(f"{f}.experts.{e}.{proj}.weight", shape)


def deepseek4_shapes(config: dict) -> Iterator[tuple[str, tuple[int, ...], np.dtype]]:
  """Every tensor of a DeepSeek V4 hub checkpoint under its flat names, the MTP block (`mtp.0.*`) included."""
  E, V, N = config["hidden_size"], config["vocab_size"], config["hc_mult"]
  bf16, f32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)
  yield "embed.weight", (V, E), bf16
  for i in range(config["num_hidden_layers"]):
    yield from _deepseek4_layer(config, f"layers.{i}", i)
  for k in range(config["num_nextn_predict_layers"]):
    m = f"mtp.{k}"
    yield from _fp8_e8m0(f"{m}.e_proj.weight", (E, E))
    yield from _fp8_e8m0(f"{m}.h_proj.weight", (E, E))
    for norm in ("enorm", "hnorm", "norm"):
      yield f"{m}.{norm}.weight", (E,), bf16
    yield f"{m}.hc_head_fn", (N, N * E), f32
    yield f"{m}.hc_head_base", (N,), f32
    yield f"{m}.hc_head_scale", (1,), f32
    yield from _deepseek4_layer(config, m, config["num_hidden_layers"] + k)
  yield "norm.weight", (E,), bf16
  yield "hc_head_fn", (N, N * E), f32
  yield "hc_head_base", (N,), f32
  yield "hc_head_scale", (1,), f32
  yield "head.weight", (V, E), bf16


# Kimi K2-Thinking / K2.5 / K2.6: Kimi K2's text model (DeepSeek V3's architecture) with its routed experts in
# compressed-tensors' pack-quantized INT4 (symmetric, groups of 32 inputs, BF16 scales), the rest BF16.
INT4_GROUP = 32

# The hub's quantization_config of K2.5 / K2.6 (inside text_config; K2-Thinking has it at the top level, without
# the two vision entries of `ignore`).
_KIMI_INT4_QUANTIZATION = {
    "config_groups": {"group_0": {
        "input_activations": None, "output_activations": None, "targets": ["Linear"],
        "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": INT4_GROUP,
                    "num_bits": 4, "observer": "minmax", "observer_kwargs": {}, "strategy": "group",
                    "symmetric": True, "type": "int"}}},
    "format": "pack-quantized", "kv_cache_scheme": None, "quant_method": "compressed-tensors",
    "quantization_status": "compressed",
    "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
               "re:.*lm_head.*", "re:vision_tower.*", "re:mm_projector.*"],
}

# Kimi-K2.6's MoonViT vision tower and projector (the remote code's keys, as its config.json names them).
_KIMI_K26_VISION = {
    "patch_size": 14, "init_pos_emb_height": 64, "init_pos_emb_width": 64, "init_pos_emb_time": 4,
    "pos_emb_type": "divided_fixed", "vt_num_attention_heads": 16, "vt_num_hidden_layers": 27,
    "vt_hidden_size": 1152, "vt_intermediate_size": 4304, "merge_kernel_size": [2, 2],
    "video_attn_type": "spatial_temporal", "merge_type": "sd2_tpool", "_attn_implementation": "flash_attention_2",
    "mm_projector_type": "patchmerger", "mm_hidden_size": 1152, "projector_hidden_act": "gelu",
    "projector_ln_eps": 1e-5, "text_hidden_size": 7168,
}


def kimi_k26_config(*, layers: int = 61, experts: int = 384, vocab: int = 163840) -> dict:
  """Kimi-K2.6's config.json as the hub ships it (the KimiK25 wrapper, Kimi K2's text config nested with its INT4
  quantization_config, the vision tower's remote-code keys); `layers`, `experts` and `vocab` make it smaller."""
  text = {
      "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "hidden_size": 7168,
      "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": layers,
      "num_attention_heads": 64, "num_key_value_heads": 64, "n_shared_experts": 1, "n_routed_experts": experts,
      "routed_scaling_factor": 2.827, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
      "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8,
      "first_k_dense_replace": 1, "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
      "moe_layer_freq": 1, "num_nextn_predict_layers": 0, "vocab_size": vocab, "rms_norm_eps": 1e-5,
      "rope_theta": 50000.0, "max_position_embeddings": 262144, "tie_word_embeddings": False,
      "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0,
                       "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
      "hidden_act": "silu", "attention_bias": False, "bos_token_id": 163584, "eos_token_id": 163585,
      "torch_dtype": "bfloat16", "quantization_config": json.loads(json.dumps(_KIMI_INT4_QUANTIZATION)),
  }
  return {
      "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
      "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config",
                   "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
                   "AutoModelForCausalLM": "modeling_kimi_k25.KimiK25ForConditionalGeneration"},
      "text_config": text, "vision_config": dict(_KIMI_K26_VISION), "media_placeholder_token_id": 163605,
      "pad_token_id": 163839, "ignore_index": -100, "use_unified_vision_chunk": True,
      "video_placeholder": "<|kimi_k25_video_placeholder|>", "torch_dtype": "bfloat16",
  }


def kimi_k26_int4_for_bytes(target_bytes: int, itemsize: int = 1) -> dict:
  """Kimi-K2.6 at its real widths (384 experts of 2048, hidden 7168, the full vision tower), its dense first layer
  and as many MoE layers as fit `target_bytes` of the hub's format; vocab 16384 (not 163840) so that the input
  and the benchmark's I/O floor fit a small disk beside a bf16 output 4x the experts' packed bytes."""
  del itemsize
  experts, vocab = 384, 16384
  one = kimi_k26_config(layers=2, experts=experts, vocab=vocab)
  per_moe_layer = sum(tensor_bytes(t) for t in _kimi_layer(one, 1))
  fixed = sum(tensor_bytes(t) for t in kimi_k26_shapes(one)) - per_moe_layer
  return kimi_k26_config(layers=1 + max(1, round((target_bytes - fixed) / per_moe_layer)), experts=experts,
                         vocab=vocab)


def _int4_packed(module: str, shape: tuple[int, int]) -> Iterator[tuple]:
  """A Linear's (out, in) weight as compressed-tensors packs it: I32 words of 8 codes along each row, BF16 scales
  per 32 inputs, and `weight_shape` [out, in] (real values: the reader checks them, sparse checkpoint or not)."""
  out, inputs = shape
  yield f"{module}.weight_packed", (out, -(-inputs // 8)), np.dtype(np.int32)
  yield f"{module}.weight_scale", (out, -(-inputs // INT4_GROUP)), np.dtype(ml_dtypes.bfloat16)
  yield f"{module}.weight_shape", (2,), np.dtype(np.int32), np.array([out, inputs], np.int32)


def _kimi_layer(config: dict, i: int) -> Iterator[tuple]:
  """Text layer `i` under the wrapper's names: attention, dense MLP and shared expert BF16, routed experts INT4,
  the router BF16 and its correction bias F32."""
  t, bf16 = config["text_config"], np.dtype(ml_dtypes.bfloat16)
  E, H = t["hidden_size"], t["num_attention_heads"]
  q, kv, nope, rope, v = (t[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                         "v_head_dim"))
  p = f"language_model.model.layers.{i}"
  yield f"{p}.input_layernorm.weight", (E,), bf16
  yield f"{p}.post_attention_layernorm.weight", (E,), bf16
  yield f"{p}.self_attn.q_a_proj.weight", (q, E), bf16
  yield f"{p}.self_attn.q_a_layernorm.weight", (q,), bf16
  yield f"{p}.self_attn.q_b_proj.weight", (H * (nope + rope), q), bf16
  yield f"{p}.self_attn.kv_a_proj_with_mqa.weight", (kv + rope, E), bf16
  yield f"{p}.self_attn.kv_a_layernorm.weight", (kv,), bf16
  yield f"{p}.self_attn.kv_b_proj.weight", (H * (nope + v), kv), bf16
  yield f"{p}.self_attn.o_proj.weight", (E, H * v), bf16
  projections = lambda M: (("gate_proj", (M, E)), ("up_proj", (M, E)), ("down_proj", (E, M)))
  if i < t["first_k_dense_replace"]:
    for proj, shape in projections(t["intermediate_size"]):
      yield f"{p}.mlp.{proj}.weight", shape, bf16
    return
  X, M = t["n_routed_experts"], t["moe_intermediate_size"]
  yield f"{p}.mlp.gate.weight", (X, E), bf16
  yield f"{p}.mlp.gate.e_score_correction_bias", (X,), np.dtype(np.float32)
  for e in range(X):
    for proj, shape in projections(M):
      yield from _int4_packed(f"{p}.mlp.experts.{e}.{proj}", shape)
  for proj, shape in projections(M * t["n_shared_experts"]):
    yield f"{p}.mlp.shared_experts.{proj}.weight", shape, bf16


def _kimi_vision(config: dict) -> Iterator[tuple]:
  """MoonViT and its projector, BF16, under the hub's names (transformers' conversion mapping reads these)."""
  v, bf16 = config["vision_config"], np.dtype(ml_dtypes.bfloat16)
  D, I, p = v["vt_hidden_size"], v["vt_intermediate_size"], v["patch_size"]
  yield "vision_tower.patch_embed.proj.weight", (D, 3, p, p), bf16
  yield "vision_tower.patch_embed.proj.bias", (D,), bf16
  yield "vision_tower.patch_embed.pos_emb.weight", (v["init_pos_emb_height"], v["init_pos_emb_width"], D), bf16
  linears = (("wqkv", 3 * D, D), ("wo", D, D), ("mlp.fc0", I, D), ("mlp.fc1", D, I))
  yield from _vit_blocks("vision_tower.encoder.blocks", v["vt_num_hidden_layers"], D, ("norm0", "norm1"), linears)
  yield "vision_tower.encoder.final_layernorm.weight", (D,), bf16
  yield "vision_tower.encoder.final_layernorm.bias", (D,), bf16
  merged = v["mm_hidden_size"] * math.prod(v["merge_kernel_size"])
  yield "mm_projector.pre_norm.weight", (v["mm_hidden_size"],), bf16
  yield "mm_projector.pre_norm.bias", (v["mm_hidden_size"],), bf16
  for name, out in (("proj.0", merged), ("proj.2", v["text_hidden_size"])):
    yield f"mm_projector.{name}.weight", (out, merged), bf16
    yield f"mm_projector.{name}.bias", (out,), bf16


def kimi_k26_shapes(config: dict) -> Iterator[tuple]:
  """Every tensor of a Kimi-K2.6 hub checkpoint: the text model under `language_model.`, then the vision tower."""
  t, bf16 = config["text_config"], np.dtype(ml_dtypes.bfloat16)
  E, V = t["hidden_size"], t["vocab_size"]
  yield "language_model.model.embed_tokens.weight", (V, E), bf16
  for i in range(t["num_hidden_layers"]):
    yield from _kimi_layer(config, i)
  yield "language_model.model.norm.weight", (E,), bf16
  yield "language_model.lm_head.weight", (V, E), bf16
  yield from _kimi_vision(config)


def parameter_count(shapes) -> int:
  """The model's parameters in `shapes`: packed INT4 words count their 8 codes; their scales and stored shapes,
  which are not parameters, are left out (FP8 block scales are counted as stored)."""
  total = 0
  for t in shapes:
    if t[0].endswith((".weight_scale", ".weight_shape")):
      continue
    total += math.prod(t[1]) * (8 if t[0].endswith(".weight_packed") else 1)
  return total


FAMILIES = {
    "qwen3_moe": (qwen3_moe_for_bytes, qwen3_moe_shapes),
    "llama": (llama_for_bytes, llama_shapes),
    "deepseek3_fp8": (deepseek3_fp8_for_bytes, deepseek3_fp8_shapes),
    "qwen3_5_fp8": (qwen3_5_fp8_for_bytes, qwen3_5_fp8_shapes),
    "deepseek4_fp4": (deepseek4_for_bytes, deepseek4_shapes),
    "kimi_k26_int4": (kimi_k26_int4_for_bytes, kimi_k26_shapes),
}
# The real model of a family, at full size, for `--dry_run` on a sparse checkpoint (benchmark --full_size_dry_run).
FULL_SIZE = {"deepseek4_fp4": deepseek4_config, "deepseek3_fp8": deepseek3_full_config,
             "kimi_k26_int4": kimi_k26_config}


def write_family_checkpoint(output_dir: str, family: str, target_bytes: int, *, seed: int = 0,
                            max_shard_bytes: int = 4 << 30) -> tuple[dict, int]:
  """A synthetic `family` checkpoint of about `target_bytes` (bfloat16); returns its config and exact size."""
  for_bytes, shapes = FAMILIES[family]
  config = for_bytes(target_bytes)
  return config, write_checkpoint(output_dir, config, list(shapes(config)), seed=seed,
                                  max_shard_bytes=max_shard_bytes)
