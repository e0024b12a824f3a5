"""Reference forward pass of MaxText's hybrid Qwen decoders (qwen3_next, qwen3_5) over a converted tree.

Each layer is a gated delta net (linear attention: a causal depthwise conv over q, k and v, L2-normalised q and
k, the delta rule with a per-head decay, a gated RMSNorm) or, closing each cycle, gated full attention (each head's
query packed with an output gate, partial rotary embeddings); then routed experts plus a sigmoid-gated shared
expert. Norms are zero-centred: MaxText adds `norm_offset` (1) to the stored scale, except the gated norm's.
The delta rule runs token by token (`jax.lax.scan`): the chunked form MaxText and transformers use computes the
same values.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from converter.families import Layout, Runtime
from converter.families.runtime import MaxTextConfig
from tools import forward


def _norm(x: jax.Array, scale: jax.Array, runtime: Runtime) -> jax.Array:
  return forward.rms_norm(x, scale + runtime.decoder.norm_offset, runtime.config.normalization_layer_epsilon)


def _l2(x: jax.Array, eps: float = 1e-6) -> jax.Array:
  return x * jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + eps)


def _delta_rule(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array) -> jax.Array:
  """q, k [b, s, H, Dk], v [b, s, H, Dv], g and beta [b, s, H] -> [b, s, H, Dv]."""

  def step(state, inputs):
    q_t, k_t, v_t, g_t, beta_t = inputs  # [b, H, ...]
    state = state * jnp.exp(g_t)[..., None, None]
    remembered = jnp.einsum("bhkv,bhk->bhv", state, k_t)
    state = state + jnp.einsum("bhk,bhv->bhkv", k_t, (v_t - remembered) * beta_t[..., None])
    return state, jnp.einsum("bhkv,bhk->bhv", state, q_t)

  b, _, h, dk = k.shape
  state = jnp.zeros((b, h, dk, v.shape[-1]), jnp.float32)
  time_major = [jnp.moveaxis(t, 1, 0) for t in (q, k, v, g, beta)]
  _, out = jax.lax.scan(step, state, time_major)
  return jnp.moveaxis(out, 0, 1)


def gated_delta_net(layer: Mapping[str, Any], x: jax.Array, cfg: MaxTextConfig) -> jax.Array:
  hk, hv, dk, dv = cfg.gdn_num_key_heads, cfg.gdn_num_value_heads, cfg.gdn_key_head_dim, cfg.gdn_value_head_dim
  r = hv // hk
  b, s, _ = x.shape
  qkvz = (x @ layer["in_proj_qkvz"]["kernel"]).reshape(b, s, hk, 2 * dk + 2 * r * dv)
  q, k = qkvz[..., :dk], qkvz[..., dk : 2 * dk]
  v, z = qkvz[..., 2 * dk : 2 * dk + r * dv], qkvz[..., 2 * dk + r * dv :]
  ba = (x @ layer["in_proj_ba"]["kernel"]).reshape(b, s, hk, 2 * r)
  beta, a = jax.nn.sigmoid(ba[..., :r].reshape(b, s, hv)), ba[..., r:].reshape(b, s, hv)
  # The causal depthwise conv runs over [q of every head | k | v], kernel (K, 1, C), then SiLU.
  mixed = jnp.concatenate([q.reshape(b, s, -1), k.reshape(b, s, -1), v.reshape(b, s, -1)], axis=-1)
  kernel = layer["conv1d"]["kernel"][:, 0, :]
  width = kernel.shape[0]
  padded = jnp.pad(mixed, ((0, 0), (width - 1, 0), (0, 0)))
  mixed = jax.nn.silu(sum(padded[:, j : j + s] * kernel[j] for j in range(width)))
  q = mixed[..., : hk * dk].reshape(b, s, hk, dk)
  k = mixed[..., hk * dk : 2 * hk * dk].reshape(b, s, hk, dk)
  v = mixed[..., 2 * hk * dk :].reshape(b, s, hv, dv)
  q, k = jnp.repeat(_l2(q), r, axis=2) * dk**-0.5, jnp.repeat(_l2(k), r, axis=2)
  g = -jnp.exp(layer["A_log"]) * jax.nn.softplus(a + layer["dt_bias"])
  out = _delta_rule(q, k, v, g, beta)
  out = forward.rms_norm(out, layer["norm"]["rms_norm"]["scale"], cfg.normalization_layer_epsilon)
  out = out * jax.nn.silu(z.reshape(b, s, hv, dv))
  return out.reshape(b, s, hv * dv) @ layer["out_proj"]["kernel"]


def gated_attention(layer: Mapping[str, Any], x: jax.Array, positions: jax.Array, runtime: Runtime) -> jax.Array:
  cfg = runtime.config
  d = cfg.head_dim
  packed = jnp.einsum("bse,ehd->bshd", x, layer["query"]["kernel"])  # Each head: [query D | gate D].
  q, gate = packed[..., :d], packed[..., d:]
  k = jnp.einsum("bse,ehd->bshd", x, layer["key"]["kernel"])
  v = jnp.einsum("bse,ehd->bshd", x, layer["value"]["kernel"])
  q, k = _norm(q, layer["query_norm"]["scale"], runtime), _norm(k, layer["key_norm"]["scale"], runtime)
  rotary = int(d * (cfg.partial_rotary_factor or 1.0))
  frequencies = forward.rope_frequencies(rotary, runtime, theta=cfg.rope_max_timescale)
  q = jnp.concatenate([forward.apply_rope(q[..., :rotary], positions, frequencies, False), q[..., rotary:]], -1)
  k = jnp.concatenate([forward.apply_rope(k[..., :rotary], positions, frequencies, False), k[..., rotary:]], -1)
  out = forward._softmax_attention(q, k, v, forward.attention_mask(x.shape[1]), d**-0.5)  # pylint: disable=protected-access
  out = out * jax.nn.sigmoid(gate)
  return out.reshape(out.shape[0], out.shape[1], -1) @ layer["out"]["kernel"]


def experts(mlp: Mapping[str, Any], x: jax.Array, cfg: MaxTextConfig) -> jax.Array:
  routed = forward.softmax_moe(mlp["routed_experts"], x, cfg)
  shared = forward.dense_mlp(mlp["shared_expert"], x)
  return routed + jax.nn.sigmoid(x @ mlp["shared_expert_gate"]["kernel"]) * shared


def logits(params: Mapping[str, Any], token_ids: np.ndarray, runtime: Runtime, layout: Layout) -> np.ndarray:
  params = jax.tree.map(lambda a: jnp.asarray(a, dtype=jnp.float32), params)
  ids = jnp.asarray(token_ids)
  positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape)
  x = params["token_embedder"]["embedding"][ids]
  for layer in forward.maxtext_layers(params["decoder"], layout):
    h = _norm(x, layer["input_layernorm"]["scale"], runtime)
    if "in_proj_qkvz" in layer["attention"]:
      h = gated_delta_net(layer["attention"], h, runtime.config)
    else:
      h = gated_attention(layer["attention"]["attention"], h, positions, runtime)
    x = x + h
    x = x + experts(layer["mlp"], _norm(x, layer["post_attention_layernorm"]["scale"], runtime), runtime.config)
  x = _norm(x, params["decoder"]["decoder_norm"]["scale"], runtime)
  return np.asarray(forward.output_logits(params, x, runtime.config))
