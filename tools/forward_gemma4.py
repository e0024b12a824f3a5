"""Reference forward pass of MaxText's Gemma 4 decoders (gemma4, gemma4_small) over a converted tree.

Each layer: sandwich-normed attention (per-head RMS norms on queries and keys, a scale-free one on values, rope on
all of a sliding layer's head and on the first `global_rope_proportion` of a global one's, queries unscaled) and
MLP, a dense one or (gemma4 MoE) the shared expert plus routed experts with their own norms; then, in gemma4_small,
the per-layer-input branch; then the layer's scalar. KV-shared layers (gemma4_small) attend with the rotated,
normed keys and values of the last earlier layer of their kind; a global layer of a `share_kv_projections` model
uses its raw keys as values. The layer norms use epsilon 1e-6 (`Decoder.layer_norm_epsilon`), the q/k/v, router,
per-layer-input and final norms `normalization_layer_epsilon`, as in MaxText.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from converter.families import Layout, Runtime
from tools import forward


def _gelu(x: jax.Array) -> jax.Array:
  return jax.nn.gelu(x, approximate=True)


def _rope(x: jax.Array, positions: jax.Array, theta: float, fraction: float) -> jax.Array:
  """Rotate-half rope whose first int(D * fraction) / 2 pairs turn (exponents over the whole head dim D); the
  others keep their values (MaxText's Gemma4PartialRotaryEmbedding, HF's "proportional" rope)."""
  dim = x.shape[-1]
  turning = int(dim * fraction) // 2
  frequencies = 1.0 / theta ** (2 * jnp.arange(turning, dtype=jnp.float32) / dim)
  frequencies = jnp.concatenate([frequencies, jnp.zeros(dim // 2 - turning, jnp.float32)])
  return forward.apply_rope(x, positions, frequencies, interleaved=False)


def _attention(attn: Mapping[str, Any], x: jax.Array, positions: jax.Array, runtime: Runtime, local: bool,
               shared_kv: tuple[jax.Array, jax.Array] | None) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """The attention output and the keys and values it used (rotated and normed)."""
  cfg = runtime.config
  eps = cfg.normalization_layer_epsilon
  theta = cfg.local_rope_max_timescale if local else cfg.global_rope_max_timescale
  fraction = cfg.local_rope_proportion if local else cfg.global_rope_proportion
  q = jnp.einsum("bse,ehd->bshd", x, attn["query"]["kernel"])
  q = _rope(forward.rms_norm(q, attn["query_norm"]["scale"], eps), positions, theta, fraction)
  if shared_kv is None:
    k = jnp.einsum("bse,ehd->bshd", x, attn["key"]["kernel"])
    v = k if cfg.share_kv_projections and not local else jnp.einsum("bse,ehd->bshd", x, attn["value"]["kernel"])
    k = _rope(forward.rms_norm(k, attn["key_norm"]["scale"], eps), positions, theta, fraction)
    shared_kv = (k, forward.rms_norm(v, None, eps))
  mask = forward.attention_mask(x.shape[1], window=cfg.sliding_window_size if local else None)
  out = forward._softmax_attention(q, *shared_kv, mask, runtime.decoder.query_scale,  # pylint: disable=protected-access
                                   cfg.attn_logits_soft_cap)
  return jnp.einsum("bshd,hde->bse", out, attn["out"]["kernel"]), shared_kv


def _experts(mlp: Mapping[str, Any], mlp_in: jax.Array, residual: jax.Array, runtime: Runtime) -> jax.Array:
  """Shared expert on the MLP input; routed experts on the normed residual, routed by the scale-free normed residual
  (times E^-0.5 and the router scale): softmax over every expert, the top k renormalised, times their scales."""
  cfg, decoder = runtime.config, runtime.decoder
  eps, layer_eps = cfg.normalization_layer_epsilon, decoder.layer_norm_epsilon
  block = mlp[decoder.moe_block]
  moe = block["MoeBlock_0"]
  shared = forward.rms_norm(forward.dense_mlp(block["shared_experts"], mlp_in, decoder.mlp_activation),
                            mlp["post_feedforward_layernorm_1"]["scale"], layer_eps)
  router_in = forward.rms_norm(residual, None, eps) * residual.shape[-1] ** -0.5 * mlp["pre_forward_scale_2"]
  logits = router_in @ moe["gate"]["kernel"]
  _, indices = jax.lax.top_k(logits, cfg.num_experts_per_tok)
  weights = jnp.take_along_axis(jax.nn.softmax(logits, axis=-1), indices, axis=-1)
  if cfg.norm_topk_prob:
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
  weights = weights * moe["per_expert_scale"][indices]
  dense_weights = jnp.sum(jax.nn.one_hot(indices, logits.shape[-1]) * weights[..., None], axis=-2)
  routed_in = forward.rms_norm(residual, mlp["pre_feedforward_layernorm_2"]["scale"], layer_eps)
  hidden = _gelu(jnp.einsum("bse,xem->bsxm", routed_in, moe["wi_0"])) * jnp.einsum("bse,xem->bsxm", routed_in,
                                                                                   moe["wi_1"])
  routed = jnp.einsum("bsxm,xme,bsx->bse", hidden, moe["wo"], dense_weights)
  return shared + forward.rms_norm(routed, mlp["post_feedforward_layernorm_2"]["scale"], layer_eps)


def _per_layer_inputs(params: Mapping[str, Any], ids: jax.Array, x: jax.Array, runtime: Runtime) -> jax.Array:
  """[b, s, L, P]: the per-layer table's rows (times sqrt(P)) and the normed projection of the embedding, mixed."""
  cfg = runtime.config
  embedder, dim = params["decoder"]["per_layer_embedder"], cfg.hidden_size_per_layer_input
  shape = ids.shape + (cfg.base_num_decoder_layers, dim)
  identity = (embedder["embed_tokens_per_layer"][ids] * dim**0.5).reshape(shape)
  context = (x @ embedder["per_layer_model_projection"]["kernel"]) * x.shape[-1] ** -0.5
  context = forward.rms_norm(context.reshape(shape), embedder["per_layer_projection_norm"]["scale"],
                             cfg.normalization_layer_epsilon)
  return (identity + context) * 2**-0.5


def _kv_shared(runtime: Runtime, layer: int) -> bool:
  first = runtime.config.base_num_decoder_layers - (runtime.config.num_kv_shared_layers or 0)
  return layer >= first > 0


def logits(params: Mapping[str, Any], token_ids: np.ndarray, runtime: Runtime, layout: Layout) -> np.ndarray:
  """params: the `params/params` subtree of a MaxText checkpoint. Returns float32 [batch, seq, vocab]."""
  cfg, decoder = runtime.config, runtime.decoder
  params = jax.tree.map(lambda a: jnp.asarray(a, dtype=jnp.float32), params)
  ids = jnp.asarray(token_ids)
  positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  x = params["token_embedder"]["embedding"][ids]  # sqrt(E) is already in the table.
  per_layer = _per_layer_inputs(params, ids, x, runtime) if cfg.hidden_size_per_layer_input else None
  eps, layer_eps = cfg.normalization_layer_epsilon, decoder.layer_norm_epsilon
  kv_of_kind: dict[bool, tuple[jax.Array, jax.Array]] = {}  # The last non-shared layer's keys and values, by kind.

  def norm(layer: Mapping[str, Any], name: str, h: jax.Array) -> jax.Array:
    return forward.rms_norm(h, layer[name]["scale"], layer_eps)

  for i, layer in enumerate(forward.maxtext_layers(params["decoder"], layout)):
    local = decoder.is_local(i)
    h, kv = _attention(layer[decoder.attention_block], norm(layer, decoder.pre_attention_norm, x), positions, runtime,
                       local, kv_of_kind[local] if _kv_shared(runtime, i) else None)
    if not _kv_shared(runtime, i):
      kv_of_kind[local] = kv
    x = x + norm(layer, decoder.post_attention_norm, h)
    mlp_in = norm(layer, decoder.pre_mlp_norm, x)
    if decoder.routing:
      h = _experts(layer["mlp"], mlp_in, x, runtime)
    else:
      h = forward.dense_mlp(layer["mlp"], mlp_in, decoder.mlp_activation)
    x = x + norm(layer, decoder.post_mlp_norm, h)
    if per_layer is not None:
      gated = _gelu(x @ layer["per_layer_input_gate"]["kernel"]) * per_layer[:, :, i]
      x = x + forward.rms_norm(gated @ layer["per_layer_projection"]["kernel"],
                               layer["post_per_layer_input_norm"]["scale"], eps)
    x = x * layer["layer_scalar"]
  x = forward.rms_norm(x, params["decoder"]["decoder_norm"]["scale"], eps)
  return np.asarray(forward.output_logits(params, x, cfg))
