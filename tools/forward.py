"""A float32 JAX forward pass over a MaxText-layout parameter tree, with MaxText's semantics.

The validator runs this on a converted checkpoint and compares its logits with the transformers reference.
It follows MaxText's decoder, not HF's: kernels in (in, heads, head_dim) layout, attention scaled at run time
only when the family does not bake the scale into the query kernel, interleaved RoPE pairs when the target's
rotary embedding uses them. A conversion error in any of those shows up as a logits difference here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from converter.families import DecoderSemantics
from converter.plan import SCAN_AXIS


@dataclasses.dataclass(frozen=True)
class ForwardConfig:
  num_layers: int
  head_dim: int
  rms_norm_eps: float
  rope_theta: float
  tie_word_embeddings: bool
  semantics: DecoderSemantics
  num_experts_per_tok: int = 0


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  variance = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
  return x * jax.lax.rsqrt(variance + eps) * scale


def rope_frequencies(head_dim: int, theta: float, llama3_scaling: bool = False) -> jax.Array:
  frequencies = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
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
    x: jax.Array, positions: jax.Array, theta: float, interleaved: bool, llama3_scaling: bool = False
) -> jax.Array:
  """x: [batch, seq, heads, head_dim]. Rotate-half pairs (i, i + D/2), or interleaved pairs (2i, 2i + 1)."""
  head_dim = x.shape[-1]
  frequencies = rope_frequencies(head_dim, theta, llama3_scaling)
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


def attention(layer: Mapping[str, Any], x: jax.Array, positions: jax.Array, cfg: ForwardConfig) -> jax.Array:
  sem = cfg.semantics
  q = jnp.einsum("bse,ehd->bshd", x, layer["query"]["kernel"])
  k = jnp.einsum("bse,ehd->bshd", x, layer["key"]["kernel"])
  v = jnp.einsum("bse,ehd->bshd", x, layer["value"]["kernel"])
  if sem.attention_bias:
    q, k, v = q + layer["query"]["bias"], k + layer["key"]["bias"], v + layer["value"]["bias"]
  if sem.qk_norm:
    q = rms_norm(q, layer["query_norm"]["scale"], cfg.rms_norm_eps)
    k = rms_norm(k, layer["key_norm"]["scale"], cfg.rms_norm_eps)
  q = apply_rope(q, positions, cfg.rope_theta, sem.rope_interleaved, sem.llama3_rope_scaling)
  k = apply_rope(k, positions, cfg.rope_theta, sem.rope_interleaved, sem.llama3_rope_scaling)
  groups = q.shape[2] // k.shape[2]
  k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
  scale = 1.0 if sem.query_scale_in_kernel else cfg.head_dim**-0.5
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * scale
  seq = x.shape[1]
  causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
  scores = jnp.where(causal, scores, -1e30)
  probs = jax.nn.softmax(scores, axis=-1)
  out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
  return jnp.einsum("bshd,hde->bse", out, layer["out"]["kernel"])


def dense_mlp(mlp: Mapping[str, Any], x: jax.Array) -> jax.Array:
  gate = x @ mlp["wi_0"]["kernel"]
  up = x @ mlp["wi_1"]["kernel"]
  return (jax.nn.silu(gate) * up) @ mlp["wo"]["kernel"]


def moe_mlp(moe: Mapping[str, Any], x: jax.Array, experts_per_token: int) -> jax.Array:
  """Softmax router, top-k, weights renormalised over the chosen experts (MaxText always renormalises)."""
  probs = jax.nn.softmax(x @ moe["gate"]["kernel"], axis=-1)  # [b, s, X]
  top_weights, top_experts = jax.lax.top_k(probs, experts_per_token)
  top_weights = top_weights / jnp.sum(top_weights, axis=-1, keepdims=True)
  weights = jnp.sum(jax.nn.one_hot(top_experts, probs.shape[-1]) * top_weights[..., None], axis=-2)
  hidden = jax.nn.silu(jnp.einsum("bse,xem->bsxm", x, moe["wi_0"])) * jnp.einsum("bse,xem->bsxm", x, moe["wi_1"])
  return jnp.einsum("bsxm,xme,bsx->bse", hidden, moe["wo"], weights)


def decoder_layer(layer: Mapping[str, Any], x: jax.Array, positions: jax.Array, cfg: ForwardConfig) -> jax.Array:
  h = rms_norm(x, layer["pre_self_attention_layer_norm"]["scale"], cfg.rms_norm_eps)
  x = x + attention(layer["self_attention"], h, positions, cfg)
  h = rms_norm(x, layer["post_self_attention_layer_norm"]["scale"], cfg.rms_norm_eps)
  if cfg.semantics.moe:
    return x + moe_mlp(layer[cfg.semantics.moe_block], h, cfg.num_experts_per_tok)
  return x + dense_mlp(layer["mlp"], h)


def unscanned_layer(decoder: Mapping[str, Any], index: int, scan_layers: bool) -> Mapping[str, Any]:
  if not scan_layers:
    return decoder[f"layers_{index}"]
  return jax.tree.map(lambda leaf: jnp.take(leaf, index, axis=SCAN_AXIS), decoder["layers"])


def logits(params: Mapping[str, Any], token_ids: np.ndarray, cfg: ForwardConfig, scan_layers: bool) -> np.ndarray:
  """params: the `params/params` subtree of a MaxText checkpoint. Returns float32 [batch, seq, vocab]."""
  params = jax.tree.map(lambda a: jnp.asarray(a, dtype=jnp.float32), params)
  ids = jnp.asarray(token_ids)
  positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  embedding = params["token_embedder"]["embedding"]
  x = embedding[ids]
  decoder = params["decoder"]
  for i in range(cfg.num_layers):
    x = decoder_layer(unscanned_layer(decoder, i, scan_layers), x, positions, cfg)
  x = rms_norm(x, decoder["decoder_norm"]["scale"], cfg.rms_norm_eps)
  if cfg.tie_word_embeddings:
    return np.asarray(x @ embedding.T)
  return np.asarray(x @ decoder["logits_dense"]["kernel"])
