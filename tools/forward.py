"""A float32 JAX forward pass over a MaxText-layout parameter tree, with MaxText's semantics.

The validator runs this on a converted checkpoint and compares its logits with the transformers reference.
It follows MaxText's decoder, not HF's: kernels in (in, heads, head_dim) layout, attention scaled at run time
only when the family does not bake the scale into the query kernel, interleaved RoPE pairs when the target's
rotary embedding uses them. A conversion error in any of those shows up as a logits difference here.
Gemma-style decoders add norms on the attention and MLP outputs, gelu (tanh) MLPs, sliding-window local layers
with their own rope base, soft caps, several HF layers per MaxText layer and block-scanned layer groups; all of it
is read from the family's DecoderSemantics.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from converter.families import DecoderSemantics
from converter.families.base import standard_layer_groups
from converter.plan import SCAN_AXIS


@dataclasses.dataclass(frozen=True)
class ForwardConfig:
  num_layers: int  # HF layers.
  head_dim: int
  rms_norm_eps: float
  rope_theta: float
  tie_word_embeddings: bool
  semantics: DecoderSemantics
  num_experts_per_tok: int = 0


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  variance = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
  return x * jax.lax.rsqrt(variance + eps) * scale


def soft_cap(x: jax.Array, cap: float | None) -> jax.Array:
  return jnp.tanh(x / cap) * cap if cap else x


def rope_frequencies(
    head_dim: int, theta: float, llama3_scaling: bool = False, linear_scaling: float = 1.0
) -> jax.Array:
  frequencies = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)) / linear_scaling
  if not llama3_scaling:
    return frequencies
  # MaxText's llama3.1 rotary embedding: factor 8, low 1, high 4, original context 8192, fixed.
  factor, low, high, original = 8.0, 1.0, 4.0, 8192.0
  wavelength = 2 * jnp.pi / frequencies
  smooth = (original / wavelength - low) / (high - low)
  scaled = jnp.where(wavelength > original / low, frequencies / factor, frequencies)
  medium = (wavelength >= original / high) & (wavelength <= original / low)
  return jnp.where(medium, (1 - smooth) * frequencies / factor + smooth * frequencies, scaled)


def apply_rope(
    x: jax.Array, positions: jax.Array, theta: float, interleaved: bool, llama3_scaling: bool = False,
    linear_scaling: float = 1.0,
) -> jax.Array:
  """x: [batch, seq, heads, head_dim]. Rotate-half pairs (i, i + D/2), or interleaved pairs (2i, 2i + 1)."""
  head_dim = x.shape[-1]
  frequencies = rope_frequencies(head_dim, theta, llama3_scaling, linear_scaling)
  angles = positions[:, :, None].astype(jnp.float32) * frequencies  # [b, s, D/2]
  sin, cos = jnp.sin(angles)[:, :, None, :], jnp.cos(angles)[:, :, None, :]
  if interleaved:
    first, second = x[..., 0::2], x[..., 1::2]
  else:
    first, second = x[..., : head_dim // 2], x[..., head_dim // 2 :]
  rotated_first = first * cos - second * sin
  rotated_second = second * cos + first * sin
  if interleaved:
    return jnp.stack([rotated_first, rotated_second], axis=-1).reshape(x.shape)
  return jnp.concatenate([rotated_first, rotated_second], axis=-1)


def rope_for(cfg: ForwardConfig, local: bool) -> tuple[float, float]:
  """(theta, linear scaling) of a local (sliding-window) or global layer."""
  sem = cfg.semantics
  theta = sem.rope_theta or cfg.rope_theta
  return (sem.local_rope_theta or theta, 1.0) if local else (theta, sem.rope_linear_scaling)


def attention_mask(seq: int, window: int | None) -> jax.Array:
  """Causal; with a window, query q sees keys k with q - window < k <= q."""
  q, k = jnp.arange(seq)[:, None], jnp.arange(seq)[None, :]
  mask = k <= q
  return mask & (k > q - window) if window else mask


def attention(
    layer: Mapping[str, Any], x: jax.Array, positions: jax.Array, cfg: ForwardConfig, local: bool = False
) -> jax.Array:
  sem = cfg.semantics
  q = jnp.einsum("bse,ehd->bshd", x, layer["query"]["kernel"])
  k = jnp.einsum("bse,ehd->bshd", x, layer["key"]["kernel"])
  v = jnp.einsum("bse,ehd->bshd", x, layer["value"]["kernel"])
  if sem.attention_bias:
    q, k, v = q + layer["query"]["bias"], k + layer["key"]["bias"], v + layer["value"]["bias"]
  if sem.qk_norm:
    q = rms_norm(q, layer["query_norm"]["scale"], cfg.rms_norm_eps)
    k = rms_norm(k, layer["key_norm"]["scale"], cfg.rms_norm_eps)
  theta, linear_scaling = rope_for(cfg, local)
  q = apply_rope(q, positions, theta, sem.rope_interleaved, sem.llama3_rope_scaling, linear_scaling)
  k = apply_rope(k, positions, theta, sem.rope_interleaved, sem.llama3_rope_scaling, linear_scaling)
  groups = q.shape[2] // k.shape[2]
  k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
  runtime_scale = cfg.head_dim**-0.5 if sem.query_scale is None else sem.query_scale
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 if sem.query_scale_in_kernel else runtime_scale)
  scores = soft_cap(scores, sem.attn_logits_soft_cap)
  scores = jnp.where(attention_mask(x.shape[1], sem.sliding_window if local else None), scores, -1e30)
  probs = jax.nn.softmax(scores, axis=-1)
  out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
  return jnp.einsum("bshd,hde->bse", out, layer["out"]["kernel"])


ACTIVATIONS = {"silu": jax.nn.silu, "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True)}


def dense_mlp(mlp: Mapping[str, Any], x: jax.Array, activation: str = "silu") -> jax.Array:
  gate = x @ mlp["wi_0"]["kernel"]
  up = x @ mlp["wi_1"]["kernel"]
  return (ACTIVATIONS[activation](gate) * up) @ mlp["wo"]["kernel"]


def moe_mlp(moe: Mapping[str, Any], x: jax.Array, experts_per_token: int) -> jax.Array:
  """Softmax router, top-k, weights renormalised over the chosen experts (MaxText always renormalises)."""
  probs = jax.nn.softmax(x @ moe["gate"]["kernel"], axis=-1)  # [b, s, X]
  top_weights, top_experts = jax.lax.top_k(probs, experts_per_token)
  top_weights = top_weights / jnp.sum(top_weights, axis=-1, keepdims=True)
  weights = jnp.sum(jax.nn.one_hot(top_experts, probs.shape[-1]) * top_weights[..., None], axis=-2)
  hidden = jax.nn.silu(jnp.einsum("bse,xem->bsxm", x, moe["wi_0"])) * jnp.einsum("bse,xem->bsxm", x, moe["wi_1"])
  return jnp.einsum("bsxm,xme,bsx->bse", hidden, moe["wo"], weights)


def layer_norm(layer: Mapping[str, Any], name: str, x: jax.Array, cfg: ForwardConfig) -> jax.Array:
  """A decoder-layer norm; with no `name` (the semantics have no such norm), the identity."""
  if not name:
    return x
  eps = cfg.semantics.layer_norm_epsilon or cfg.rms_norm_eps
  return rms_norm(x, layer[name]["scale"], eps)


def decoder_layer(
    layer: Mapping[str, Any], x: jax.Array, positions: jax.Array, cfg: ForwardConfig, hf_layer: int = 0,
    suffix: str = "",
) -> jax.Array:
  """HF layer `hf_layer`: the modules of `layer` whose names end in `suffix` (Gemma2 holds two HF layers)."""
  sem = cfg.semantics

  def norm(name: str, h: jax.Array) -> jax.Array:
    return layer_norm(layer, name + suffix if name else "", h, cfg)

  h = norm(sem.pre_attention_norm, x)
  h = attention(layer["self_attention" + suffix], h, positions, cfg, local=sem.is_local(hf_layer))
  x = x + norm(sem.post_attention_norm, h)
  h = norm(sem.pre_mlp_norm, x)
  if sem.moe:
    h = moe_mlp(layer[sem.moe_block + suffix], h, cfg.num_experts_per_tok)
  else:
    h = dense_mlp(layer["mlp" + suffix], h, sem.mlp_activation)
  return x + norm(sem.post_mlp_norm, h)


def take_layer(stacked: Mapping[str, Any], index: int) -> Mapping[str, Any]:
  return jax.tree.map(lambda leaf: jnp.take(leaf, index, axis=SCAN_AXIS), stacked)


def maxtext_layers(decoder: Mapping[str, Any], num_layers: int, scan_layers: bool, sem: DecoderSemantics) -> list:
  """Each MaxText layer's subtree, in layer order, taken out of the family's layer groups."""
  groups = (sem.layer_groups or standard_layer_groups)(num_layers, scan_layers)
  layers = {}
  for group in groups:
    subtree = decoder
    for key in group.path[1:]:  # The path starts at "decoder".
      subtree = subtree[key]
    for index, layer in enumerate(group.layers):
      layers[layer] = take_layer(subtree, index) if group.stacked else subtree
  return [layers[i] for i in range(num_layers)]


def output_logits(params: Mapping[str, Any], x: jax.Array, cfg: ForwardConfig) -> jax.Array:
  """Untied: the logits kernel. Tied: the embedding table, / sqrt(E) if normalized, then the final soft cap."""
  if not cfg.tie_word_embeddings:
    return x @ params["decoder"]["logits_dense"]["kernel"]
  logits = x @ params["token_embedder"]["embedding"].T
  if cfg.semantics.normalize_embedding_logits:
    logits = logits / jnp.sqrt(jnp.float32(x.shape[-1]))
  return soft_cap(logits, cfg.semantics.final_logits_soft_cap)


def logits(params: Mapping[str, Any], token_ids: np.ndarray, cfg: ForwardConfig, scan_layers: bool) -> np.ndarray:
  """params: the `params/params` subtree of a MaxText checkpoint. Returns float32 [batch, seq, vocab]."""
  params = jax.tree.map(lambda a: jnp.asarray(a, dtype=jnp.float32), params)
  ids = jnp.asarray(token_ids)
  positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  x = params["token_embedder"]["embedding"][ids]  # Any embedding scale is already in the table.
  decoder = params["decoder"]
  suffixes = cfg.semantics.sublayer_suffixes
  for i, layer in enumerate(maxtext_layers(decoder, cfg.num_layers // len(suffixes), scan_layers, cfg.semantics)):
    for k, suffix in enumerate(suffixes):
      x = decoder_layer(layer, x, positions, cfg, hf_layer=i * len(suffixes) + k, suffix=suffix)
  x = rms_norm(x, decoder["decoder_norm"]["scale"], cfg.rms_norm_eps)
  return np.asarray(output_logits(params, x, cfg))
