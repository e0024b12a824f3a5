"""Pieces shared by decoder families: embeddings, attention, MLPs and norms in MaxText's layout."""

from __future__ import annotations

import dataclasses
import functools
import math

from converter import ops
from converter.errors import ConversionError
from converter.families.base import DecoderSemantics, LayerGroup, Layout, Param, standard_layer_groups
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
  query_scale = 1.0 / math.sqrt(D) if semantics.query_scale is None else semantics.query_scale
  scale = (ops.ScaleInFloat32(query_scale),) if semantics.query_scale_in_kernel else ()
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
        Param(f"{prefix}/query_norm/scale", f"{attn}.q_norm.weight", (D,), norm_offset(semantics) + rope),
        Param(f"{prefix}/key_norm/scale", f"{attn}.k_norm.weight", (D,), norm_offset(semantics) + rope),
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


# Gemma-style decoders: norm scales stored as w + offset, a scaled embedding table, norms around attention and MLP,
# several HF layers per MaxText layer, layers scanned in blocks.
def norm_offset(semantics: DecoderSemantics) -> tuple[ops.Op, ...]:
  return (ops.AddInFloat32(semantics.norm_scale_offset),) if semantics.norm_scale_offset else ()


def scaled_embeddings(cfg: ModelConfig, semantics: DecoderSemantics, target_vocab: int) -> tuple[Param, ...]:
  """`embeddings`, the table multiplied by `embedding_scale` in float32 and the final norm offset."""
  scale = (ops.ScaleInFloat32(semantics.embedding_scale),) if semantics.embedding_scale != 1.0 else ()
  extra = {"token_embedder/embedding": scale, "decoder/decoder_norm/scale": norm_offset(semantics)}
  return tuple(dataclasses.replace(p, ops=extra.get(p.maxtext, ()) + p.ops) for p in embeddings(cfg, target_vocab))


def sandwich_norms(cfg: ModelConfig, semantics: DecoderSemantics, suffix: str = "") -> tuple[Param, ...]:
  """Norms before attention and MLP, and (when the semantics name them) on their outputs.

  HF's `post_attention_layernorm` is the pre-MLP norm when there are no output norms (Gemma), else the norm on
  the attention output (Gemma 2/3, whose pre-MLP norm is `pre_feedforward_layernorm`).
  """
  E, offset = cfg.hidden_size, norm_offset(semantics)
  if semantics.post_attention_norm:
    hf_names = {semantics.pre_attention_norm: "input_layernorm",
                semantics.post_attention_norm: "post_attention_layernorm",
                semantics.pre_mlp_norm: "pre_feedforward_layernorm",
                semantics.post_mlp_norm: "post_feedforward_layernorm"}
  else:
    hf_names = {semantics.pre_attention_norm: "input_layernorm", semantics.pre_mlp_norm: "post_attention_layernorm"}
  return tuple(Param(f"{name}{suffix}/scale", f"{LAYER}.{hf}.weight", (E,), offset) for name, hf in hf_names.items())


def sandwich_layer(cfg: ModelConfig, semantics: DecoderSemantics) -> tuple[Param, ...]:
  """One MaxText layer of norms + attention + dense MLP; with several sublayer suffixes (Gemma2's _local/_global)
  MaxText layer i holds HF layers n*i .. n*i + n-1, the k-th under the k-th suffix."""
  n = len(semantics.sublayer_suffixes)
  params = []
  for k, suffix in enumerate(semantics.sublayer_suffixes):
    sublayer = (sandwich_norms(cfg, semantics, suffix) + attention(cfg, semantics, f"self_attention{suffix}")
                + dense_mlp(cfg, f"mlp{suffix}"))
    params += [dataclasses.replace(p, layer_stride=n, layer_offset=k) for p in sublayer]
  return tuple(params)


def sublayered_num_layers(cfg: ModelConfig, semantics: DecoderSemantics) -> int:
  n = len(semantics.sublayer_suffixes)
  if cfg.num_layers % n:
    raise ConversionError(f"{cfg.path}: num_hidden_layers={cfg.num_layers} is not a multiple of {n}: MaxText's"
                          f" decoder pairs HF layers {n} to a layer ({', '.join(semantics.sublayer_suffixes)})")
  return cfg.num_layers // n


def sandwich_decoder(cfg: ModelConfig, semantics: DecoderSemantics, target_vocab: int) -> Layout:
  """The Gemma 1/2/3 layout, driven by the semantics (norm names, sublayers, layer groups)."""
  kwargs = {"layer_groups": semantics.layer_groups} if semantics.layer_groups else {}
  return Layout(top=scaled_embeddings(cfg, semantics, target_vocab), layer=sandwich_layer(cfg, semantics),
                num_layers=sublayered_num_layers(cfg, semantics), **kwargs)


def _block_layer_groups(block: int, num_layers: int, scan_layers: bool) -> list[LayerGroup]:
  if not scan_layers:
    return standard_layer_groups(num_layers, scan_layers)
  blocks, remainder = divmod(num_layers, block)
  groups = [LayerGroup(("decoder", "layers", f"layers_{j}"), tuple(block * b + j for b in range(blocks)), True)
            for j in range(block if blocks else 0)]
  return groups + [LayerGroup(("decoder", "layers_remainder", f"layers_{k}"), (block * blocks + k,), False)
                   for k in range(remainder)]


def block_layer_groups(block: int):
  """Scanned: `decoder/layers/layers_{j}` (j < block) stacking layers block*b + j on the scan axis, then the
  remainder unscanned under `decoder/layers_remainder/layers_{k}` (MaxText's gemma3). Unscanned: standard."""
  return functools.partial(_block_layer_groups, block)


def layer_pattern(cfg: ModelConfig, semantics: DecoderSemantics, hf_pattern: int) -> None:
  """Refuses an HF `layer_types` (default: every `hf_pattern`-th layer global) that differs from the local/global
  pattern MaxText's decoder hard-codes."""
  default = ["full_attention" if (i + 1) % hf_pattern == 0 else "sliding_attention" for i in range(cfg.num_layers)]
  actual = list(cfg.get("layer_types") or default)
  expected = ["sliding_attention" if semantics.is_local(i) else "full_attention" for i in range(cfg.num_layers)]
  if actual != expected:
    raise ConversionError(f"{cfg.path}: layer_types {actual} differs from the local/global pattern MaxText's decoder"
                          f" hard-codes ({expected})")


def no_rope_scaling(cfg: ModelConfig, target: str) -> list[str]:
  scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
  kind = scaling.get("rope_type", scaling.get("type", "default"))
  if kind != "default":
    return [f"{cfg.path}: rope scaling {scaling}; MaxText's {target} decoder applies none"]
  return []


def gemma_checks(cfg: ModelConfig, target: str, activation_key: str) -> list[str]:
  """What MaxText's gemma decoders fix whatever the config says: layer-norm epsilon 1e-6, gelu (tanh), causal."""
  warnings = []
  eps = cfg.rms_norm_eps
  if eps != 1e-6:
    warnings.append(f"{cfg.path}: rms_norm_eps={eps}, but MaxText's {target} decoder layers use 1e-6 whatever"
                    " normalization_layer_epsilon says: logits will differ slightly from HF")
  activation = cfg.get(activation_key) or "gelu_pytorch_tanh"
  tanh_gelus = ("gelu_pytorch_tanh", "gelu_new") + (("gelu",) if activation_key == "hidden_act" else ())
  if activation not in tanh_gelus:  # transformers reads Gemma v1's legacy hidden_act "gelu" as the tanh one.
    warnings.append(f"{cfg.path}: {activation_key}={activation!r}; MaxText's {target} MLP uses gelu with the tanh"
                    " approximation")
  if cfg.get("use_bidirectional_attention"):
    warnings.append(f"{cfg.path}: use_bidirectional_attention is set; MaxText's {target} decoder is causal")
  if not cfg.tie_word_embeddings and cfg.get("final_logit_softcapping"):
    warnings.append(f"{cfg.path}: untied embeddings: MaxText applies final_logits_soft_cap to tied logits only")
  return warnings


def soft_cap(value) -> float:
  """HF's null soft cap is MaxText's 0.0 (off)."""
  return float(value) if value else 0.0
