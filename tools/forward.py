"""A float32 JAX forward pass over a MaxText-layout parameter tree, computing what MaxText computes.

The validator runs this on a converted checkpoint and compares its logits with the transformers reference. It
reads only the checkpoint's tree, the layout (which leaf holds which layer) and the `Runtime` the converter
records: the MaxText config overrides it prints for the user and the decoder's fixed rules. So a wrong transform,
a misplaced layer or a missing override each shows up as a logits difference.

Covered: rotate-half, llama3.1 (interleaved, llama3 scaling) and YaRN rotary embeddings; grouped-query and
multi-head latent attention (DeepSeek, with V3.2's sparse indexer); q/k RMS and L2 norms, biases, sinks, soft caps,
sliding windows, chunked attention and NoPE layers; dense, softmax-routed, DeepSeek-routed (sigmoid scores,
bias, groups, shared experts), GPT-OSS (biased router, clamped SwiGLU) and Llama 4 (sigmoid top-1, shared
expert) MLPs; Gemma's norms around attention and MLP, paired layers and block-scanned layer groups.
"""

from __future__ import annotations

import importlib
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from converter.families import Layout, Runtime
from converter.families.runtime import Decoder, MaxTextConfig

NEG_INF = -1e30
GPT_OSS_SWIGLU_ALPHA = 1.702  # Hard-coded in MaxText's layers/moe.py, as in HF.


def rms_norm(x: jax.Array, scale: jax.Array | None, eps: float) -> jax.Array:
  variance = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
  x = x * jax.lax.rsqrt(variance + eps)
  return x if scale is None else x * scale


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float = 1e-6) -> jax.Array:
  mean = jnp.mean(x, axis=-1, keepdims=True)
  variance = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(variance + eps) * scale + bias


def soft_cap(x: jax.Array, cap: float | None) -> jax.Array:
  return jnp.tanh(x / cap) * cap if cap else x


# --- rotary embeddings ------------------------------------------------------------------------------------------


def _llama3_scaled(frequencies: jax.Array) -> jax.Array:
  """MaxText's llama3.1 rotary embedding: factor 8, low 1, high 4, original context 8192, fixed."""
  factor, low, high, original = 8.0, 1.0, 4.0, 8192.0
  wavelength = 2 * jnp.pi / frequencies
  smooth = (original / wavelength - low) / (high - low)
  scaled = jnp.where(wavelength > original / low, frequencies / factor, frequencies)
  medium = (wavelength >= original / high) & (wavelength <= original / low)
  return jnp.where(medium, (1 - smooth) * frequencies / factor + smooth * frequencies, scaled)


def _yarn(frequencies: jax.Array, dim: int, cfg: MaxTextConfig) -> jax.Array:
  """YaRN's frequency blend (MaxText's YarnRotaryEmbedding, as DeepSeek's and HF's)."""
  theta, factor = cfg.rope_max_timescale, cfg.rope_factor
  original = cfg.original_max_position_embeddings

  def correction_dim(rotations: float) -> float:
    return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

  low, high = correction_dim(cfg.beta_fast), correction_dim(cfg.beta_slow)
  if cfg.rope_truncate is not False:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  if low == high:
    high += 0.001
  ramp = jnp.clip((jnp.arange(dim // 2, dtype=jnp.float32) - low) / (high - low), 0, 1)
  smooth = 1 - ramp
  return frequencies / factor * (1 - smooth) + frequencies * smooth


def rope_frequencies(dim: int, runtime: Runtime, *, theta: float, linear_scaling: float = 1.0) -> jax.Array:
  frequencies = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)) / linear_scaling
  kind, cfg = runtime.decoder.rope, runtime.config
  if kind == "llama3.1" and cfg.rope_use_scale is not False:
    return _llama3_scaled(frequencies)
  if kind == "yarn":
    return _yarn(frequencies, dim, cfg)
  return frequencies


def yarn_attention_scale(cfg: MaxTextConfig) -> float:
  """YaRN's factor on cos/sin (rope_attention_scaling: GPT-OSS), else 1."""
  if cfg.rope_attention_scaling and cfg.rope_factor and cfg.rope_factor > 1:
    return 0.1 * math.log(cfg.rope_factor) + 1.0
  return 1.0


def apply_rope(x: jax.Array, positions: jax.Array, frequencies: jax.Array, interleaved: bool,
               scale: float = 1.0) -> jax.Array:
  """x: [batch, seq, heads, dim]. Rotate-half pairs (i, i + D/2), or interleaved pairs (2i, 2i + 1)."""
  angles = positions[:, :, None].astype(jnp.float32) * frequencies  # [b, s, D/2]
  sin, cos = jnp.sin(angles)[:, :, None, :] * scale, jnp.cos(angles)[:, :, None, :] * scale
  half = x.shape[-1] // 2
  first, second = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :half], x[..., half:])
  rotated_first = first * cos - second * sin
  rotated_second = second * cos + first * sin
  if interleaved:
    return jnp.stack([rotated_first, rotated_second], axis=-1).reshape(x.shape)
  return jnp.concatenate([rotated_first, rotated_second], axis=-1)


def rope_of_layer(runtime: Runtime, hf_layer: int) -> tuple[float, float] | None:
  """(theta, linear scaling) of a layer's rotary embedding; None for a NoPE layer (Llama 4)."""
  cfg, decoder = runtime.config, runtime.decoder
  if cfg.nope_layer_interval and cfg.nope_layer_interval > 0 and (hf_layer + 1) % cfg.nope_layer_interval == 0:
    return None
  if decoder.is_local(hf_layer):
    return cfg.local_rope_max_timescale or cfg.rope_max_timescale, 1.0
  return cfg.rope_max_timescale, cfg.rope_linear_scaling_factor or 1.0


# --- attention --------------------------------------------------------------------------------------------------


def attention_mask(seq: int, *, window: int | None = None, chunk: int | None = None) -> jax.Array:
  """Causal; with a window, query q sees keys k with q - window < k <= q; with a chunk, only its own chunk."""
  q, k = jnp.arange(seq)[:, None], jnp.arange(seq)[None, :]
  mask = k <= q
  if window:
    mask &= k > q - window
  if chunk:
    mask &= (q // chunk) == (k // chunk)
  return mask


def layer_mask(seq: int, runtime: Runtime, hf_layer: int) -> jax.Array:
  cfg = runtime.config
  if runtime.decoder.is_local(hf_layer):
    return attention_mask(seq, window=cfg.sliding_window_size)
  if cfg.chunk_attn_window_size and rope_of_layer(runtime, hf_layer) is not None:
    return attention_mask(seq, chunk=cfg.chunk_attn_window_size)  # Llama 4: chunked except on NoPE layers.
  return attention_mask(seq)


def _softmax_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
                       cap: float | None = None, sinks: jax.Array | None = None) -> jax.Array:
  """q [b, s, h, d], k/v [b, s, kv, d] (grouped heads repeated); `sinks` [h] join the softmax and take no value."""
  groups = q.shape[2] // k.shape[2]
  k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
  scores = soft_cap(jnp.einsum("bqhd,bkhd->bhqk", q, k) * scale, cap)
  scores = jnp.where(mask, scores, NEG_INF)
  if sinks is not None:
    sink = jnp.broadcast_to(sinks[None, :, None, None], scores.shape[:-1] + (1,))
    probs = jax.nn.softmax(jnp.concatenate([scores, sink], axis=-1), axis=-1)[..., :-1]
  else:
    probs = jax.nn.softmax(scores, axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def attention(layer: Mapping[str, Any], x: jax.Array, positions: jax.Array, runtime: Runtime,
              hf_layer: int) -> jax.Array:
  cfg, decoder = runtime.config, runtime.decoder
  q = jnp.einsum("bse,ehd->bshd", x, layer["query"]["kernel"])
  k = jnp.einsum("bse,ehd->bshd", x, layer["key"]["kernel"])
  v = jnp.einsum("bse,ehd->bshd", x, layer["value"]["kernel"])
  if "bias" in layer["query"]:
    q, k, v = q + layer["query"]["bias"], k + layer["key"]["bias"], v + layer["value"]["bias"]
  eps = cfg.normalization_layer_epsilon
  if decoder.qk_norm == "rms":
    q = rms_norm(q, layer["query_norm"]["scale"], eps)
    k = rms_norm(k, layer["key_norm"]["scale"], eps)
  elif decoder.qk_norm == "global":  # One norm over all heads (OLMo 3).
    q = rms_norm(q.reshape(q.shape[:2] + (-1,)), layer["query_norm"]["scale"], eps).reshape(q.shape)
    k = rms_norm(k.reshape(k.shape[:2] + (-1,)), layer["key_norm"]["scale"], eps).reshape(k.shape)
  rope = rope_of_layer(runtime, hf_layer)
  if rope is not None:
    theta, linear_scaling = rope
    frequencies = rope_frequencies(cfg.head_dim, runtime, theta=theta, linear_scaling=linear_scaling)
    interleaved = decoder.rope == "llama3.1" or (decoder.rope == "yarn" and cfg.rope_interleave is not False)
    scale = yarn_attention_scale(cfg) if decoder.rope == "yarn" else 1.0
    q = apply_rope(q, positions, frequencies, interleaved, scale)
    k = apply_rope(k, positions, frequencies, interleaved, scale)
    if decoder.qk_norm == "l2" and cfg.use_qk_norm:  # Llama 4: after RoPE, rope layers only.
      q, k = rms_norm(q, None, eps), rms_norm(k, None, eps)
  elif cfg.temperature_tuning:  # Llama 4's NoPE layers: queries scaled up beyond 8192 positions.
    floor_scale, attn_scale = 8192.0, 0.1  # Hard-coded in MaxText's llama4 decoder, HF's defaults.
    q = q * (jnp.log1p(jnp.floor((positions + 1.0) / floor_scale)) * attn_scale + 1.0)[:, :, None, None]
  scale = cfg.head_dim**-0.5 if decoder.query_scale is None else decoder.query_scale
  out = _softmax_attention(q, k, v, layer_mask(x.shape[1], runtime, hf_layer), scale, cfg.attn_logits_soft_cap,
                           layer.get("sinks") if decoder.attention_sinks else None)
  out = jnp.einsum("bshd,hde->bse", out, layer["out"]["kernel"])
  return out + layer["out"]["bias"] if "bias" in layer["out"] else out


def _mla_softmax_scale(cfg: MaxTextConfig) -> float:
  scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
  if (cfg.max_position_embeddings or 0) > (cfg.original_max_position_embeddings or 0) and (cfg.rope_factor or 1) > 1:
    mscale = 0.1 * (cfg.mscale if cfg.mscale is not None else 1.0) * math.log(cfg.rope_factor) + 1.0
    scale *= mscale * mscale
  return scale


def _indexer_mask(layer: Mapping[str, Any], x: jax.Array, low_rank_q: jax.Array, positions: jax.Array,
                  frequencies: jax.Array, causal: jax.Array, cfg: MaxTextConfig) -> jax.Array:
  """DeepSeek V3.2's sparse attention: each query keeps its `indexer_topk` best-scored keys."""
  heads, dim, rope_dim = cfg.indexer_n_heads, cfg.indexer_head_dim, cfg.qk_rope_head_dim
  q = jnp.einsum("bsr,rhd->bshd", low_rank_q, layer["wq_b"]["kernel"])
  k = layer_norm(x @ layer["wk"]["kernel"], layer["k_norm"]["scale"], layer["k_norm"]["bias"])[:, :, None, :]

  def rope_first(t: jax.Array) -> jax.Array:  # [rope, nope] split, half-split pairs (unlike MLA's).
    return jnp.concatenate([apply_rope(t[..., :rope_dim], positions, frequencies, False), t[..., rope_dim:]], -1)

  q, k = rope_first(q), rope_first(k)[:, :, 0, :]
  weights = (x @ layer["weights_proj"]["kernel"]) * heads**-0.5 * dim**-0.5
  scores = jnp.einsum("bthd,bsd->btsh", q, k)
  score = jnp.einsum("btsh,bth->bts", jax.nn.relu(scores), weights)
  seq = x.shape[1]
  if seq <= cfg.indexer_topk:
    return jnp.broadcast_to(causal, score.shape)
  score = jnp.where(causal, score, -jnp.inf)
  threshold = jax.lax.top_k(score, cfg.indexer_topk)[0][..., -1:]
  return (score >= threshold) & causal


def mla_attention(layer: Mapping[str, Any], x: jax.Array, positions: jax.Array, runtime: Runtime) -> jax.Array:
  """DeepSeek's multi-head latent attention: low-rank queries and a compressed shared key/value latent."""
  cfg = runtime.config
  eps, nope, rope_dim = cfg.normalization_layer_epsilon, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
  low_rank_q = None
  if cfg.q_lora_rank:
    low_rank_q = rms_norm(x @ layer["wq_a"]["kernel"], layer["q_norm"]["scale"], eps)
    q = jnp.einsum("bsr,rhd->bshd", low_rank_q, layer["wq_b"]["kernel"])
  else:
    q = jnp.einsum("bse,ehd->bshd", x, layer["query"]["kernel"])
  kv_a = x @ layer["wkv_a"]["kernel"]
  latent, k_rope = rms_norm(kv_a[..., : cfg.kv_lora_rank], layer["kv_norm"]["scale"], eps), kv_a[..., cfg.kv_lora_rank:]
  kv = jnp.einsum("bsr,rhd->bshd", latent, layer["wkv_b"]["kernel"])
  k_nope, v = kv[..., :nope], kv[..., nope:]
  frequencies = rope_frequencies(rope_dim, runtime, theta=cfg.rope_max_timescale)
  interleaved = cfg.rope_interleave is not False
  q_rope = apply_rope(q[..., nope:], positions, frequencies, interleaved)
  k_rope = apply_rope(k_rope[:, :, None, :], positions, frequencies, interleaved)
  q = jnp.concatenate([q[..., :nope], q_rope], axis=-1)
  k = jnp.concatenate([k_nope, jnp.broadcast_to(k_rope, k_nope.shape[:-1] + (rope_dim,))], axis=-1)
  mask = attention_mask(x.shape[1])
  if cfg.use_indexer:
    mask = _indexer_mask(layer["indexer"], x, low_rank_q, positions, frequencies, mask, cfg)[:, None]
  out = _softmax_attention(q, k, v, mask, _mla_softmax_scale(cfg))
  return jnp.einsum("bshd,hde->bse", out, layer["out"]["kernel"])


# --- MLPs -------------------------------------------------------------------------------------------------------

ACTIVATIONS = {"silu": jax.nn.silu, "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True)}


def dense_mlp(mlp: Mapping[str, Any], x: jax.Array, activation: str = "silu") -> jax.Array:
  gate = x @ mlp["wi_0"]["kernel"]
  up = x @ mlp["wi_1"]["kernel"]
  return (ACTIVATIONS[activation](gate) * up) @ mlp["wo"]["kernel"]


def _experts(moe: Mapping[str, Any], x: jax.Array, weights: jax.Array) -> jax.Array:
  """Every expert on every token, weighted by `weights` [b, s, X] (zero for unchosen experts)."""
  hidden = jax.nn.silu(jnp.einsum("bse,xem->bsxm", x, moe["wi_0"])) * jnp.einsum("bse,xem->bsxm", x, moe["wi_1"])
  return jnp.einsum("bsxm,xme,bsx->bse", hidden, moe["wo"], weights)


def _dense_weights(indices: jax.Array, values: jax.Array, experts: int) -> jax.Array:
  return jnp.sum(jax.nn.one_hot(indices, experts) * values[..., None], axis=-2)


def softmax_moe(moe: Mapping[str, Any], x: jax.Array, cfg: MaxTextConfig) -> jax.Array:
  """Top-k of the router logits, softmax over them (MaxText always renormalises)."""
  logits = x @ moe["gate"]["kernel"]
  top, indices = jax.lax.top_k(logits, cfg.num_experts_per_tok)
  return _experts(moe, x, _dense_weights(indices, jax.nn.softmax(top, axis=-1), logits.shape[-1]))


def deepseek_moe(block: Mapping[str, Any], x: jax.Array, runtime: Runtime) -> jax.Array:
  """Routed experts plus shared experts. deepseek3*: sigmoid scores, the gate bias for the choice only, top-2
  group sums choose `topk_routing_group` groups; deepseek2*: top-k of the softmax. Weights are normalised for
  sigmoid scores, then times `routed_scaling_factor`."""
  cfg = runtime.config
  moe = block["MoeBlock_0"]
  logits = x @ moe["gate"]["kernel"]
  scores = jax.nn.sigmoid(logits) if cfg.routed_score_func == "sigmoid" else jax.nn.softmax(logits, axis=-1)
  experts = scores.shape[-1]
  if cfg.routed_bias:
    choice = scores + moe["gate"]["bias"]
    if cfg.n_routing_groups and cfg.n_routing_groups > 0:
      grouped = choice.reshape(choice.shape[:-1] + (cfg.n_routing_groups, -1))
      group_scores = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)
      _, groups = jax.lax.top_k(group_scores, cfg.topk_routing_group)
      keep = jnp.sum(jax.nn.one_hot(groups, cfg.n_routing_groups), axis=-2)
      choice = jnp.where(jnp.repeat(keep, experts // cfg.n_routing_groups, axis=-1) > 0, choice, -jnp.inf)
    _, indices = jax.lax.top_k(choice, cfg.num_experts_per_tok)
  else:
    _, indices = jax.lax.top_k(scores, cfg.num_experts_per_tok)
  weights = jnp.take_along_axis(scores, indices, axis=-1)
  if cfg.routed_score_func == "sigmoid":
    weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
  weights = weights * cfg.routed_scaling_factor
  routed = _experts(moe, x, _dense_weights(indices, weights, experts))
  return routed + dense_mlp(block["shared_experts"], x)


def gpt_oss_moe(moe: Mapping[str, Any], x: jax.Array, cfg: MaxTextConfig) -> jax.Array:
  """Biased router logits, softmax over the top k; each expert a clamped SwiGLU with biases."""
  logits = x @ moe["gate"]["kernel"] + moe["gate"]["bias"]
  top, indices = jax.lax.top_k(logits, cfg.num_experts_per_tok)
  weights = _dense_weights(indices, jax.nn.softmax(top, axis=-1), logits.shape[-1])
  limit = cfg.mlp_activations_limit
  gate = jnp.einsum("bse,xem->bsxm", x, moe["wi_0"]) + moe["wi_0_bias"]
  up = jnp.einsum("bse,xem->bsxm", x, moe["wi_1"]) + moe["wi_1_bias"]
  gate = jnp.minimum(gate, limit)
  up = jnp.clip(up, -limit, limit)
  hidden = (up + 1) * gate * jax.nn.sigmoid(gate * GPT_OSS_SWIGLU_ALPHA)
  out = jnp.einsum("bsxm,xme->bsxe", hidden, moe["wo"]) + moe["wo_bias"]
  return jnp.einsum("bsxe,bsx->bse", out, weights)


def llama4_moe(block: Mapping[str, Any], x: jax.Array, cfg: MaxTextConfig) -> jax.Array:
  """The sigmoid of each chosen expert's router logit scales that expert's input; plus the shared expert."""
  moe = block["MoeBlock_0"]
  logits = x @ moe["gate"]["kernel"]
  top, indices = jax.lax.top_k(logits, cfg.num_experts_per_tok)
  scales = _dense_weights(indices, jax.nn.sigmoid(top), logits.shape[-1])  # [b, s, X], zero when unchosen.
  scaled = x[:, :, None, :] * scales[..., None]  # [b, s, X, E]
  hidden = jax.nn.silu(jnp.einsum("bsxe,xem->bsxm", scaled, moe["wi_0"])) * jnp.einsum("bsxe,xem->bsxm", scaled,
                                                                                        moe["wi_1"])
  chosen = (scales > 0).astype(x.dtype)
  routed = jnp.einsum("bsxm,xme,bsx->bse", hidden, moe["wo"], chosen)
  return routed + dense_mlp(block["shared_experts"], x)


def mlp(layer: Mapping[str, Any], x: jax.Array, runtime: Runtime, suffix: str) -> jax.Array:
  decoder, cfg = runtime.decoder, runtime.config
  if decoder.moe_block not in layer:  # Dense layers: every layer of a dense model, DeepSeek's first ones, ...
    return dense_mlp(layer["mlp" + suffix], x, decoder.mlp_activation)
  block = layer[decoder.moe_block]
  if decoder.routing == "softmax":
    return softmax_moe(block, x, cfg)
  if decoder.routing == "deepseek":
    return deepseek_moe(block, x, runtime)
  if decoder.routing == "gpt_oss":
    return gpt_oss_moe(block, x, cfg)
  if decoder.routing == "llama4":
    return llama4_moe(block, x, cfg)
  raise ValueError(f"unknown routing {decoder.routing!r}")


# --- the decoder ------------------------------------------------------------------------------------------------


def decoder_layer(layer: Mapping[str, Any], x: jax.Array, positions: jax.Array, runtime: Runtime, hf_layer: int,
                  suffix: str = "") -> jax.Array:
  """HF layer `hf_layer`: the modules of `layer` whose names end in `suffix` (Gemma2 holds two HF layers)."""
  decoder = runtime.decoder
  eps = decoder.layer_norm_epsilon or runtime.config.normalization_layer_epsilon

  def norm(name: str, h: jax.Array) -> jax.Array:
    return rms_norm(h, layer[name + suffix]["scale"], eps) if name else h

  h = norm(decoder.pre_attention_norm, x)
  if decoder.attention == "mla":
    h = mla_attention(layer["self_attention"], h, positions, runtime)
  else:
    h = attention(layer[decoder.attention_block + suffix], h, positions, runtime, hf_layer)
  x = x + norm(decoder.post_attention_norm, h)
  h = mlp(layer, norm(decoder.pre_mlp_norm, x), runtime, suffix)
  return x + norm(decoder.post_mlp_norm, h)


def _take(subtree: Any, index: int, axes: Mapping[tuple[str, ...], int], prefix: tuple[str, ...] = ()) -> Any:
  if isinstance(subtree, Mapping):
    return {k: _take(v, index, axes, prefix + (k,)) for k, v in subtree.items()}
  return jnp.take(subtree, index, axis=axes[prefix])


def maxtext_layers(decoder_tree: Mapping[str, Any], layout: Layout) -> list[Mapping[str, Any]]:
  """Each MaxText layer's subtree, in layer order, taken out of the layout's layer groups."""
  layers = {}
  for group in layout.groups:
    subtree = decoder_tree
    for key in group.path[1:]:  # The path starts at "decoder".
      subtree = subtree[key]
    axes = {tuple(p.maxtext.split("/")): p.scan_axis for p in group.resolved().params}
    for position, layer in group.positions():
      value = subtree
      for index in position if group.stacked else ():
        value = _take(value, index, axes)  # The block, then the layer in it (now on the same axis).
      layers[layer] = value
  return [layers[i] for i in range(len(layers))]


def output_logits(params: Mapping[str, Any], x: jax.Array, cfg: MaxTextConfig) -> jax.Array:
  """Untied: the logits kernel. Tied: the embedding table, / sqrt(E) if normalized, then the final soft cap."""
  if not cfg.logits_via_embedding:
    return x @ params["decoder"]["logits_dense"]["kernel"]
  logits = x @ params["token_embedder"]["embedding"].T
  if cfg.normalize_embedding_logits is not False:  # MaxText's default is true.
    logits = logits / jnp.sqrt(jnp.float32(x.shape[-1]))
  return soft_cap(logits, cfg.final_logits_soft_cap)


def logits(params: Mapping[str, Any], token_ids: np.ndarray, runtime: Runtime, layout: Layout, *,
           platform: str = "cpu") -> np.ndarray:
  """params: the `params/params` subtree of a MaxText checkpoint. Returns float32 [batch, seq, vocab].

  Computes on `platform`'s devices: leaves already on them (a sharded restore) stay as they are, any other is moved
  to its first device. The host's CPU by default, wherever the checkpoint was restored, so that the logits held
  against transformers' are the same numbers on every platform: even at full precision an accelerator's results
  differ from the CPU's in the last digits, which recurrences, Sinkhorn rounds and top-k choices inside the forward
  grow past any threshold that would still catch a wrong transform (measured: docs/testing.md). Matrix products
  run at full float32 precision everywhere ("highest"): a TPU's default computes them through bfloat16.
  """
  device = jax.local_devices(backend=platform)[0]

  def placed(leaf: Any) -> Any:
    on_platform = isinstance(leaf, jax.Array) and all(d.platform == device.platform for d in leaf.devices())
    return leaf if on_platform else jax.device_put(leaf, device)

  params = jax.tree.map(placed, params)
  with jax.default_device(device), jax.default_matmul_precision("highest"):
    if runtime.decoder.forward:
      module = importlib.import_module(f"tools.forward_{runtime.decoder.forward}")
      return module.logits(params, token_ids, runtime, layout)
    return _logits(params, token_ids, runtime, layout)


def _logits(params: Mapping[str, Any], token_ids: np.ndarray, runtime: Runtime, layout: Layout) -> np.ndarray:
  params = jax.tree.map(lambda a: jnp.asarray(a, dtype=jnp.float32), params)
  ids = jnp.asarray(token_ids)
  positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  x = params["token_embedder"]["embedding"][ids]  # Any embedding scale is already in the table.
  suffixes = runtime.decoder.sublayer_suffixes
  for i, layer in enumerate(maxtext_layers(params["decoder"], layout)):
    for k, suffix in enumerate(suffixes):
      x = decoder_layer(layer, x, positions, runtime, hf_layer=i * len(suffixes) + k, suffix=suffix)
  x = rms_norm(x, params["decoder"]["decoder_norm"]["scale"], runtime.config.normalization_layer_epsilon)
  return np.asarray(output_logits(params, x, runtime.config))


__all__ = ["Decoder", "logits", "maxtext_layers"]
