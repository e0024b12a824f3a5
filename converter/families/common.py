"""Pieces shared by decoder families: embeddings, attention, MLPs and norms in MaxText's layout."""

from __future__ import annotations

import math

from converter import ops
from converter.families.base import DecoderSemantics, Layout, Param
from converter.model_config import ModelConfig

LAYER = "model.layers.{layer}"


def embeddings(cfg: ModelConfig, target_vocab: int) -> tuple[Param, ...]:
  """Token embedding, final norm and, for untied models, the logits kernel (vocab zero-padded to target)."""
  V, E = cfg.vocab_size, cfg.hidden_size
  params = [
      Param("token_embedder/embedding", "model.embed_tokens.weight", (V, E), (ops.PadRows(target_vocab),)),
      Param("decoder/decoder_norm/scale", "model.norm.weight", (E,)),
  ]
  if not cfg.tie_word_embeddings:
    params.append(
        Param("decoder/logits_dense/kernel", "lm_head.weight", (V, E), (ops.Transpose(), ops.PadColumns(target_vocab)))
    )
  return tuple(params)


def attention(cfg: ModelConfig, semantics: DecoderSemantics, prefix: str = "self_attention") -> tuple[Param, ...]:
  E, H, KV, D = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  rope = (ops.InterleaveRope(),) if semantics.rope_interleaved else ()
  scale = (ops.ScaleInFloat32(1.0 / math.sqrt(D)),) if semantics.query_scale_in_kernel else ()
  attn = f"{LAYER}.self_attn"
  params = [
      Param(f"{prefix}/query/kernel", f"{attn}.q_proj.weight", (H * D, E), ops.to_heads_kernel(E, H, D) + rope + scale),
      Param(f"{prefix}/key/kernel", f"{attn}.k_proj.weight", (KV * D, E), ops.to_heads_kernel(E, KV, D) + rope),
      Param(f"{prefix}/value/kernel", f"{attn}.v_proj.weight", (KV * D, E), ops.to_heads_kernel(E, KV, D)),
      Param(f"{prefix}/out/kernel", f"{attn}.o_proj.weight", (E, H * D), ops.to_out_kernel(E, H, D)),
  ]
  if semantics.attention_bias:
    params += [
        Param(f"{prefix}/query/bias", f"{attn}.q_proj.bias", (H * D,), ops.to_heads_bias(H, D) + rope + scale),
        Param(f"{prefix}/key/bias", f"{attn}.k_proj.bias", (KV * D,), ops.to_heads_bias(KV, D) + rope),
        Param(f"{prefix}/value/bias", f"{attn}.v_proj.bias", (KV * D,), ops.to_heads_bias(KV, D)),
    ]
  if semantics.qk_norm:
    params += [
        Param(f"{prefix}/query_norm/scale", f"{attn}.q_norm.weight", (D,), rope),
        Param(f"{prefix}/key_norm/scale", f"{attn}.k_norm.weight", (D,), rope),
    ]
  return tuple(params)


def layer_norms(cfg: ModelConfig) -> tuple[Param, ...]:
  E = cfg.hidden_size
  return (
      Param("pre_self_attention_layer_norm/scale", f"{LAYER}.input_layernorm.weight", (E,)),
      Param("post_self_attention_layer_norm/scale", f"{LAYER}.post_attention_layernorm.weight", (E,)),
  )


def dense_mlp(cfg: ModelConfig, prefix: str = "mlp") -> tuple[Param, ...]:
  E, M = cfg.hidden_size, cfg.intermediate_size
  mlp = f"{LAYER}.mlp"
  return (
      Param(f"{prefix}/wi_0/kernel", f"{mlp}.gate_proj.weight", (M, E), (ops.Transpose(),)),
      Param(f"{prefix}/wi_1/kernel", f"{mlp}.up_proj.weight", (M, E), (ops.Transpose(),)),
      Param(f"{prefix}/wo/kernel", f"{mlp}.down_proj.weight", (E, M), (ops.Transpose(),)),
  )


def moe_mlp(
    cfg: ModelConfig, *, prefix: str, router: str, experts: str, gate: str, up: str, down: str, num_experts: int,
    expert_dim: int,
) -> tuple[Param, ...]:
  """Router kernel (E, X) and expert weights stacked experts-first: wi_0/wi_1 (X, E, M), wo (X, M, E)."""
  E, X, M = cfg.hidden_size, num_experts, expert_dim
  expert = f"{LAYER}.{experts}.{{expert}}"
  return (
      Param(f"{prefix}/gate/kernel", f"{LAYER}.{router}.weight", (X, E), (ops.Transpose(),)),
      Param(f"{prefix}/wi_0", f"{expert}.{gate}.weight", (M, E), (ops.Transpose(),), experts=X),
      Param(f"{prefix}/wi_1", f"{expert}.{up}.weight", (M, E), (ops.Transpose(),), experts=X),
      Param(f"{prefix}/wo", f"{expert}.{down}.weight", (E, M), (ops.Transpose(),), experts=X),
  )


def dense_decoder(cfg: ModelConfig, semantics: DecoderSemantics, target_vocab: int) -> Layout:
  """Llama-style decoder: the layout of Llama, Mistral, Qwen2 and Qwen3."""
  return Layout(
      top=embeddings(cfg, target_vocab),
      layer=layer_norms(cfg) + attention(cfg, semantics) + dense_mlp(cfg),
      num_layers=cfg.num_layers,
  )


def single_target(target: str):
  return lambda cfg: target


def no_sliding_window(cfg: ModelConfig, target: str) -> list[str]:
  window = cfg.get("sliding_window")
  if window and cfg.get("use_sliding_window", True):
    return [f"{cfg.path}: sliding_window={window}; MaxText's {target} decoder ignores it, so logits match HF only"
            f" for sequences of at most {window} tokens"]
  return []
