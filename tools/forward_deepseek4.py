"""Reference forward pass of MaxText's DeepSeek V4 decoder (deepseek4) over a converted tree.

The residual stream is `mhc_expansion_rate` (N) streams. Around attention and around the MoE block an mHC mixer
reads the flattened streams (RMS-normed with its `mhc_norm` scale) and makes the sublayer's input (a `pre`
weighted sum of the streams), the weights that spread its output back (`post`) and the streams' mixing matrix
(`res`, made doubly stochastic by Sinkhorn rounds); after the last layer a head mixer collapses the streams.

Attention: one key = value head and low-rank queries, both RMS-normed, rope (interleaved pairs) on the last
`qk_rope_head_dim` channels, the main base on sliding-only layers and the compressed base elsewhere; a sliding
window of keys plus, on compressed layers, compressed entries: ratio 128 (HCA) pools each closed window of 128
tokens, ratio 4 (CSA) pools overlapping windows of 8 and keeps, per query, the `indexer_topk` entries its
lightning indexer scores best. Sinks join the softmax; the output's rope channels are turned back, then projected
per group (`o_a_proj`) and together (`o_b_proj`). MoE: sqrtsoftplus scores; the first `first_num_hash_layers`
route by the token's row of `tid2eid`, the others by the top k of scores + gate bias; the routed experts clamp
their gate (above) and up (both sides) at `mlp_activations_limit`, the shared expert does not (as in MaxText).
The mHC epsilons are MaxText's hard-coded 1e-6.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from converter.families import Layout, Runtime
from converter.families.deepseek4 import MAXTEXT_HC_EPS
from tools import forward


def _rope(x: jax.Array, positions: jax.Array, theta: float, rope_dim: int) -> jax.Array:
  """Interleaved rope on the last `rope_dim` channels of x [b, s, h, d]; the others keep their values."""
  frequencies = 1.0 / theta ** (jnp.arange(0, rope_dim, 2, dtype=jnp.float32) / rope_dim)
  turned = forward.apply_rope(x[..., -rope_dim:], positions, frequencies, interleaved=True)
  return jnp.concatenate([x[..., :-rope_dim], turned], axis=-1)


def _mixer(mixer: Mapping[str, Any], streams: jax.Array, eps: float,
           sinkhorn_iterations: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(post [b, s, N], res [b, s, N, N], the sublayer's input [b, s, E]) from the streams [b, s, N, E]."""
  b, s, n, _ = streams.shape
  flat = forward.rms_norm(streams.reshape(b, s, -1), mixer["mhc_norm"]["scale"], eps)
  pre = jax.nn.sigmoid(flat @ mixer["pre_alpha"] * mixer["pre_alpha_scale"][0] + mixer["pre_beta"]) + MAXTEXT_HC_EPS
  post = 2 * jax.nn.sigmoid(flat @ mixer["post_alpha"] * mixer["post_alpha_scale"][0] + mixer["post_beta"])
  res = (flat @ mixer["res_alpha"]).reshape(b, s, n, n) * mixer["res_alpha_scale"][0] + mixer["res_beta"]
  res = jax.nn.softmax(res, axis=-1) + MAXTEXT_HC_EPS
  res = res / (res.sum(axis=-2, keepdims=True) + MAXTEXT_HC_EPS)
  for _ in range(sinkhorn_iterations - 1):
    res = res / (res.sum(axis=-1, keepdims=True) + MAXTEXT_HC_EPS)
    res = res / (res.sum(axis=-2, keepdims=True) + MAXTEXT_HC_EPS)
  return post, res, jnp.einsum("bsn,bsne->bse", pre, streams)


def _compress(compressor: Mapping[str, Any], x: jax.Array, ratio: int, overlap: bool, theta: float, rope_dim: int,
              eps: float) -> jax.Array:
  """The entries [b, T, d] of every closed window of `ratio` tokens (T = s // ratio): gated sums of the window's
  projections, normed and roped at the window's first position; with `overlap` (CSA) each entry pools the first
  half of the previous window's projections with the second half of its own."""
  b, s, _ = x.shape
  windows = s // ratio
  kv = (x @ compressor["kv_proj"]["kernel"])[:, :windows * ratio].reshape(b, windows, ratio, -1)
  gate = (x @ compressor["gate_proj"]["kernel"])[:, :windows * ratio].reshape(b, windows, ratio, -1)
  gate = gate + compressor["position_bias"]
  if overlap:
    d = kv.shape[-1] // 2
    previous_kv = jnp.pad(kv[:, :-1, :, :d], ((0, 0), (1, 0), (0, 0), (0, 0)))
    previous_gate = jnp.pad(gate[:, :-1, :, :d], ((0, 0), (1, 0), (0, 0), (0, 0)), constant_values=-jnp.inf)
    kv = jnp.concatenate([previous_kv, kv[..., d:]], axis=2)
    gate = jnp.concatenate([previous_gate, gate[..., d:]], axis=2)
  pooled = (kv * jax.nn.softmax(gate, axis=2)).sum(axis=2)
  entries = forward.rms_norm(pooled, compressor["kv_norm"]["scale"], eps)
  positions = jnp.broadcast_to(jnp.arange(windows) * ratio, (b, windows))
  return _rope(entries[:, :, None], positions, theta, rope_dim)[:, :, 0]


def _visible(positions: jax.Array, entries: int, ratio: int) -> jax.Array:
  """[b, s, T]: query t sees entry w once its window closed, (w + 1) * ratio <= t + 1."""
  return jnp.arange(entries)[None, None, :] < ((positions + 1) // ratio)[:, :, None]


def _indexed(csa: Mapping[str, Any], x: jax.Array, low_rank_q: jax.Array, positions: jax.Array, runtime: Runtime,
             ratio: int) -> jax.Array:
  """[b, s, T]: the CSA entries each query attends to, the `indexer_topk` its lightning indexer scores best."""
  cfg = runtime.config
  indexer, heads, dim = csa["indexer"], cfg.indexer_n_heads, cfg.indexer_head_dim
  theta, rope_dim, eps = cfg.compressed_rope_max_timescale, cfg.qk_rope_head_dim, cfg.normalization_layer_epsilon
  keys = _compress(indexer, x, ratio, True, theta, rope_dim, eps)  # [b, T, Di]
  b, s, _ = x.shape
  if not keys.shape[1]:
    return jnp.zeros((b, s, 0), bool)
  q = _rope((low_rank_q @ indexer["q_proj"]["kernel"]).reshape(b, s, heads, dim), positions, theta, rope_dim)
  scores = jax.nn.relu(jnp.einsum("bshd,btd->bsht", q, keys)) * dim ** -0.5
  weights = (x @ indexer["weights_proj"]["kernel"]) * heads ** -0.5
  scores = jnp.einsum("bsht,bsh->bst", scores, weights)
  visible = _visible(positions, keys.shape[1], ratio)
  scores = jnp.where(visible, scores, -jnp.inf)
  _, chosen = jax.lax.top_k(scores, min(cfg.indexer_topk, keys.shape[1]))
  picked = jnp.zeros(scores.shape, bool).at[jnp.arange(b)[:, None, None], jnp.arange(s)[None, :, None], chosen].set(True)
  return picked & visible


def _attention(attn: Mapping[str, Any], x: jax.Array, positions: jax.Array, runtime: Runtime, ratio: int) -> jax.Array:
  cfg = runtime.config
  eps, rope_dim = cfg.normalization_layer_epsilon, cfg.qk_rope_head_dim
  theta = cfg.compressed_rope_max_timescale if ratio else cfg.rope_max_timescale
  b, s, _ = x.shape
  low_rank_q = forward.rms_norm(x @ attn["wq_a"]["kernel"], attn["q_norm"]["scale"], eps)
  q = forward.rms_norm(jnp.einsum("bsr,rhd->bshd", low_rank_q, attn["wq_b"]["kernel"]), None, eps)
  q = _rope(q, positions, theta, rope_dim)
  kv = forward.rms_norm(jnp.einsum("bse,ekd->bskd", x, attn["wkv"]["kernel"]), attn["kv_norm"]["scale"], eps)
  keys = _rope(kv, positions, theta, rope_dim)[:, :, 0]  # [b, s, D]: one head, keys and values alike.
  mask = jnp.broadcast_to(forward.attention_mask(s, window=cfg.sliding_window_size), (b, s, s))
  if ratio:  # 4: CSA, its entries chosen by the indexer; more: HCA, every closed window's entry.
    csa = ratio == 4
    compressor = attn["csa_compressor" if csa else "hca_compressor"]
    entries = _compress(compressor, x, ratio, csa, theta, rope_dim, eps)
    seen = (_indexed(compressor, x, low_rank_q, positions, runtime, ratio) if csa
            else _visible(positions, entries.shape[1], ratio))
    keys, mask = jnp.concatenate([keys, entries], axis=1), jnp.concatenate([mask, seen], axis=-1)
  scores = jnp.einsum("bshd,btd->bhst", q, keys) * q.shape[-1] ** -0.5
  scores = jnp.where(mask[:, None], scores, forward.NEG_INF)
  sinks = jnp.broadcast_to(attn["sinks"][None, :, None, None], scores.shape[:-1] + (1,))
  probs = jax.nn.softmax(jnp.concatenate([scores, sinks], axis=-1), axis=-1)[..., :-1]
  out = _rope(jnp.einsum("bhst,btd->bshd", probs, keys), -positions, theta, rope_dim)  # Turned back.
  groups = attn["o_a_proj"]["kernel"].shape[0]
  grouped = jnp.einsum("bsgi,gio->bsgo", out.reshape(b, s, groups, -1), attn["o_a_proj"]["kernel"])
  return grouped.reshape(b, s, -1) @ attn["o_b_proj"]["kernel"]


def _moe(mlp: Mapping[str, Any], x: jax.Array, ids: jax.Array, runtime: Runtime, hashed: bool) -> jax.Array:
  cfg = runtime.config
  routed, limit = mlp["MoeBlock_0"], cfg.mlp_activations_limit
  scores = jnp.sqrt(jax.nn.softplus(x @ routed["gate"]["kernel"]))  # [b, s, X]
  if hashed:
    chosen = routed["tid2eid"].astype(jnp.int32)[ids]
  else:
    _, chosen = jax.lax.top_k(scores + routed["gate"]["bias"], cfg.num_experts_per_tok)
  weights = jnp.take_along_axis(scores, chosen, axis=-1)
  if cfg.norm_topk_prob:
    weights = weights / (weights.sum(axis=-1, keepdims=True) + 1e-20)
  dense = jnp.zeros_like(scores).at[jnp.arange(x.shape[0])[:, None, None], jnp.arange(x.shape[1])[None, :, None],
                                    chosen].add(weights * cfg.routed_scaling_factor)
  gate = jnp.minimum(jnp.einsum("bse,xem->bsxm", x, routed["wi_0"]), limit)
  up = jnp.clip(jnp.einsum("bse,xem->bsxm", x, routed["wi_1"]), -limit, limit)
  experts = jnp.einsum("bsxm,xme->bsxe", jax.nn.silu(gate) * up, routed["wo"])
  return jnp.einsum("bsxe,bsx->bse", experts, dense) + forward.dense_mlp(mlp["shared_experts"], x)


def logits(params: Mapping[str, Any], token_ids: np.ndarray, runtime: Runtime, layout: Layout) -> np.ndarray:
  """params: the `params/params` subtree of a MaxText checkpoint. Returns float32 [batch, seq, vocab]."""
  cfg = runtime.config
  eps, streams_n = cfg.normalization_layer_epsilon, cfg.mhc_expansion_rate
  params = jax.tree.map(lambda a: jnp.asarray(a, dtype=jnp.float32), params)
  ids = jnp.asarray(token_ids)
  positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  embedded = params["token_embedder"]["embedding"][ids]
  streams = jnp.repeat(embedded[:, :, None], streams_n, axis=2)
  for i, layer in enumerate(forward.maxtext_layers(params["decoder"], layout)):
    for mixer, norm in (("mhc_attention", "pre_self_attention_layer_norm"),
                        ("mhc_mlp", "post_self_attention_layer_norm")):
      post, res, collapsed = _mixer(layer[mixer], streams, eps, cfg.sinkhorn_iterations)
      h = forward.rms_norm(collapsed, layer[norm]["scale"], eps)
      if mixer == "mhc_attention":
        h = _attention(layer["self_attention"], h, positions, runtime, cfg.compress_ratios[i])
      else:
        h = _moe(layer["mlp"], h, ids, runtime, hashed=i < cfg.first_num_hash_layers)
      streams = post[..., None] * h[:, :, None] + jnp.einsum("bskm,bske->bsme", res, streams)
  head = params["decoder"]["hc_head"]
  b, s = ids.shape
  flat = forward.rms_norm(streams.reshape(b, s, -1), None, MAXTEXT_HC_EPS)
  pre = jax.nn.sigmoid(flat @ head["hc_fn"] * head["hc_scale"][0] + head["hc_base"]) + MAXTEXT_HC_EPS
  x = forward.rms_norm(jnp.einsum("bsn,bsne->bse", pre, streams), params["decoder"]["decoder_norm"]["scale"], eps)
  return np.asarray(forward.output_logits(params, x, cfg))
