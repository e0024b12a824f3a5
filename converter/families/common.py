"""Pieces shared by decoder families: embeddings, attention, MLPs and norms in MaxText's layout, the MaxText
config every decoder needs, and the checks several families share."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from converter import ops
from converter.errors import ConversionError
from converter.families.base import LayerGroup, Layout, Param, standard_layer_groups
from converter.families.runtime import Decoder, MaxTextConfig, Runtime
from converter.model_config import ModelConfig

LAYER = "model.layers.{layer}"


@dataclasses.dataclass(frozen=True)
class WeightRules:
  """How a family stores HF weights so that its target's decoder computes what HF computes.

  `query_scale`: a factor baked into query kernels and biases (MaxText's llama2-style decoders attend unscaled);
  `interleave_rope`: q/k kernels permuted from HF's half-split rotary order to interleaved pairs (MaxText's
  llama3.1 rotary embedding); `norm_offset`: norm scales stored as w + offset (HF Gemma computes x * (1 + w));
  `embedding_scale`: baked into the embedding table (Gemma's sqrt(E)).
  """

  query_scale: float | None = None
  interleave_rope: bool = False
  norm_offset: float = 0.0
  embedding_scale: float = 1.0

  def norm(self) -> tuple[ops.Op, ...]:
    return (ops.AddInFloat32(self.norm_offset),) if self.norm_offset else ()


def maxtext_config(cfg: ModelConfig, **overrides: Any) -> MaxTextConfig:
  """The dimensions every MaxText decoder needs from config.json, plus `overrides`."""
  base = dict(
      base_emb_dim=cfg.hidden_size, base_num_query_heads=cfg.num_heads, base_num_kv_heads=cfg.num_kv_heads,
      head_dim=cfg.head_dim, base_mlp_dim=cfg.intermediate_size, base_num_decoder_layers=cfg.num_layers,
      vocab_size=cfg.vocab_size, normalization_layer_epsilon=cfg.rms_norm_eps, rope_max_timescale=cfg.rope_theta,
      logits_via_embedding=cfg.tie_word_embeddings,
      # MaxText divides tied logits by sqrt(emb_dim) by default, which only Gemma's baked sqrt(E) expects.
      normalize_embedding_logits=False if cfg.tie_word_embeddings else None,
  )
  base.update(overrides)
  return MaxTextConfig(**base)


def runtime(cfg: ModelConfig, decoder: Decoder, **overrides: Any) -> Runtime:
  return Runtime(maxtext_config(cfg, **overrides), decoder)


def embeddings(cfg: ModelConfig, target_vocab: int, rules: WeightRules = WeightRules(), *, model: str = "model",
               lm_head: str = "lm_head.weight") -> tuple[Param, ...]:
  """Token embedding (times `rules.embedding_scale`), final norm and, for untied models, the logits kernel; the
  vocabulary zero-padded to `target_vocab`."""
  V, E = cfg.vocab_size, cfg.hidden_size
  scale = (ops.ScaleInFloat32(rules.embedding_scale),) if rules.embedding_scale != 1.0 else ()
  params = [
      Param("token_embedder/embedding", f"{model}.embed_tokens.weight", (V, E), scale + (ops.PadRows(target_vocab),)),
      Param("decoder/decoder_norm/scale", f"{model}.norm.weight", (E,), rules.norm()),
  ]
  if not cfg.tie_word_embeddings:
    params.append(Param("decoder/logits_dense/kernel", lm_head, (V, E),
                        (ops.Transpose(), ops.PadColumns(target_vocab))))
  return tuple(params)


def attention(cfg: ModelConfig, rules: WeightRules, *, prefix: str = "self_attention",
              hf: str = f"{LAYER}.self_attn", qk_norm: bool = False, bias: bool = False,
              out_bias: bool = False) -> tuple[Param, ...]:
  """q/k/v/o projections split into heads; optional q/k/v biases, o bias and per-head q/k norms."""
  E, H, KV, D = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  rope = (ops.InterleaveRope(),) if rules.interleave_rope else ()
  scale = (ops.ScaleInFloat32(rules.query_scale),) if rules.query_scale is not None else ()
  params = [
      Param(f"{prefix}/query/kernel", f"{hf}.q_proj.weight", (H * D, E), ops.to_heads_kernel(E, H, D) + rope + scale),
      Param(f"{prefix}/key/kernel", f"{hf}.k_proj.weight", (KV * D, E), ops.to_heads_kernel(E, KV, D) + rope),
      Param(f"{prefix}/value/kernel", f"{hf}.v_proj.weight", (KV * D, E), ops.to_heads_kernel(E, KV, D)),
      Param(f"{prefix}/out/kernel", f"{hf}.o_proj.weight", (E, H * D), ops.to_out_kernel(E, H, D)),
  ]
  if bias:
    params += [
        Param(f"{prefix}/query/bias", f"{hf}.q_proj.bias", (H * D,), ops.to_heads_bias(H, D) + rope + scale),
        Param(f"{prefix}/key/bias", f"{hf}.k_proj.bias", (KV * D,), ops.to_heads_bias(KV, D) + rope),
        Param(f"{prefix}/value/bias", f"{hf}.v_proj.bias", (KV * D,), ops.to_heads_bias(KV, D)),
    ]
  if out_bias:
    params.append(Param(f"{prefix}/out/bias", f"{hf}.o_proj.bias", (E,)))
  if qk_norm:
    params += [
        Param(f"{prefix}/query_norm/scale", f"{hf}.q_norm.weight", (D,), rules.norm() + rope),
        Param(f"{prefix}/key_norm/scale", f"{hf}.k_norm.weight", (D,), rules.norm() + rope),
    ]
  return tuple(params)


def layer_norms(cfg: ModelConfig, layer: str = LAYER) -> tuple[Param, ...]:
  E = cfg.hidden_size
  return (
      Param("pre_self_attention_layer_norm/scale", f"{layer}.input_layernorm.weight", (E,)),
      Param("post_self_attention_layer_norm/scale", f"{layer}.post_attention_layernorm.weight", (E,)),
  )


def dense_mlp(cfg: ModelConfig, prefix: str = "mlp", hf: str = f"{LAYER}.mlp",
              intermediate: int | None = None) -> tuple[Param, ...]:
  E, M = cfg.hidden_size, intermediate or cfg.intermediate_size
  return (
      Param(f"{prefix}/wi_0/kernel", f"{hf}.gate_proj.weight", (M, E), (ops.Transpose(),)),
      Param(f"{prefix}/wi_1/kernel", f"{hf}.up_proj.weight", (M, E), (ops.Transpose(),)),
      Param(f"{prefix}/wo/kernel", f"{hf}.down_proj.weight", (E, M), (ops.Transpose(),)),
  )


def moe_mlp(
    cfg: ModelConfig, *, prefix: str, router: str, experts: str, gate: str, up: str, down: str, num_experts: int,
    expert_dim: int, layer: str = LAYER,
) -> tuple[Param, ...]:
  """Router kernel (E, X) and expert weights, one HF tensor per expert, stacked experts-first: wi_0/wi_1 (X, E, M),
  wo (X, M, E)."""
  E, X, M = cfg.hidden_size, num_experts, expert_dim
  expert = f"{layer}.{experts}.{{expert}}"
  return (
      Param(f"{prefix}/gate/kernel", f"{layer}.{router}.weight", (X, E), (ops.Transpose(),)),
      Param(f"{prefix}/wi_0", f"{expert}.{gate}.weight", (M, E), (ops.Transpose(),), experts=X),
      Param(f"{prefix}/wi_1", f"{expert}.{up}.weight", (M, E), (ops.Transpose(),), experts=X),
      Param(f"{prefix}/wo", f"{expert}.{down}.weight", (E, M), (ops.Transpose(),), experts=X),
  )


def fused_experts(prefix: str, gate_up: str, down: str, *, experts: int, hidden: int, expert_dim: int,
                  interleaved: bool) -> tuple[Param, ...]:
  """Experts stored fused in two HF tensors, gate_up (X, E, 2M) and down (X, M, E), already (in, out): gate and up
  are the even and odd columns (`interleaved`, GPT-OSS) or the two halves (Llama 4)."""
  X, E, M = experts, hidden, expert_dim
  split = ops.interleaved if interleaved else ops.halves
  return (
      Param(f"{prefix}/wi_0", gate_up, (X, E, 2 * M), (split(0, 2, 2 * M),), experts=X, experts_in_tensor=True),
      Param(f"{prefix}/wi_1", gate_up, (X, E, 2 * M), (split(1, 2, 2 * M),), experts=X, experts_in_tensor=True),
      Param(f"{prefix}/wo", down, (X, M, E), experts=X, experts_in_tensor=True),
  )


def strided_block_groups(params_of_layer: Callable[[int], tuple[Param, ...]], *, cycle: int, num_layers: int,
                         scan_layers: bool, config_path: str) -> tuple[LayerGroup, ...]:
  """Scanned: `decoder/layers/layers_{b}` for b < cycle, each stacking HF layers b, b + cycle, b + 2 cycle, ...
  (strided, not contiguous: MaxText's inhomogeneous layer cycle). Unscanned: `decoder/layers_{i}`.
  `params_of_layer(i)` is layer i's params, the same for every layer of a block."""
  if not scan_layers:
    return tuple(LayerGroup(("decoder", f"layers_{i}"), (i,), False, params_of_layer(i)) for i in range(num_layers))
  if num_layers % cycle:
    raise ConversionError(f"{config_path}: num_hidden_layers={num_layers} is not a multiple of {cycle}: MaxText scans"
                          f" this decoder in blocks of {cycle} layers (convert with --noscan_layers instead)")
  return tuple(LayerGroup(("decoder", "layers", f"layers_{b}"), tuple(range(b, num_layers, cycle)), True,
                          params_of_layer(b)) for b in range(cycle))


def dense_decoder(cfg: ModelConfig, rules: WeightRules, target_vocab: int, scan_layers: bool, *,
                  qk_norm: bool = False, bias: bool = False) -> Layout:
  """Llama-style decoder: the layout of Llama, Mistral, Qwen2 and Qwen3."""
  layer = layer_norms(cfg) + attention(cfg, rules, qk_norm=qk_norm, bias=bias) + dense_mlp(cfg)
  return Layout(embeddings(cfg, target_vocab), standard_layer_groups(layer, cfg.num_layers, scan_layers))


def single_target(target: str):
  return lambda cfg: target


def no_sliding_window(cfg: ModelConfig, target: str) -> list[str]:
  window = cfg.get("sliding_window")
  if window and cfg.get("use_sliding_window", True):
    return [f"{cfg.path}: sliding_window={window}; MaxText's {target} decoder ignores it, so logits match HF only"
            f" for sequences of at most {window} tokens"]
  return []


def norm_topk_prob_ignored(cfg: ModelConfig, target: str) -> list[str]:
  if not cfg.get("norm_topk_prob", False):
    return [f"{cfg.path}: norm_topk_prob is false, but MaxText's {target} always renormalises the top-k router"
            " weights: logits will differ from HF"]
  return []


# The rope types transformers computes (its ROPE_INIT_FUNCTIONS, Gemma 4's proportional, Qwen2-VL's legacy mrope).
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional", "mrope")
_ROPE_NUMBERS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
                 "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "partial_rotary_factor",
                 "rope_theta")


def rope_parameters(cfg: ModelConfig) -> dict[str, Any]:
  """HF's rope scaling: `rope_scaling` (transformers 4, hub configs) or `rope_parameters` (transformers 5), refused
  naming config.json and the key where transformers could not read it either: not an object, a rope type it does
  not know (or none beside a factor), a setting that is not a finite non-negative number."""
  key = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
  value = cfg.get(key) or {}
  if not isinstance(value, dict):
    raise ConversionError(f"{cfg.path}: {key} is {value!r}; transformers reads an object such as"
                          " {\"rope_type\": \"yarn\", \"factor\": 4.0, ...}")
  # transformers 5 nests one object per attention type (Gemma 3 and 4: sliding_attention, full_attention).
  per_type = bool(value) and all(isinstance(v, dict) for v in value.values())
  for where, params in ([(f"{key}.{k}", v) for k, v in value.items()] if per_type else [(key, value)]):
    _check_rope(cfg.path, where, params)
  return dict(value)


def _check_rope(path: str, key: str, params: dict[str, Any]) -> None:
  kind = params.get("rope_type", params.get("type"))
  if kind is None and params.get("factor") is not None:
    raise ConversionError(f"{path}: {key} has a factor but no rope_type; transformers needs one of"
                          f" {', '.join(ROPE_TYPES)}")
  if kind is not None and kind not in ROPE_TYPES:
    raise ConversionError(f"{path}: {key}.rope_type {kind!r} is not a rope type transformers knows"
                          f" ({', '.join(ROPE_TYPES)})")
  for name in _ROPE_NUMBERS:
    number = params.get(name)
    if number is not None and (isinstance(number, bool) or not isinstance(number, (int, float)) or
                               not math.isfinite(number) or number < 0):
      raise ConversionError(f"{path}: {key}.{name} is {number!r}, not a finite non-negative number")
  section = params.get("mrope_section")
  if section is not None and (not isinstance(section, list) or
                              not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in section)):
    raise ConversionError(f"{path}: {key}.mrope_section is {section!r}, not a list of non-negative integers")


def rope_kind(scaling: dict[str, Any]) -> str:
  return scaling.get("rope_type", scaling.get("type", "default")) or "default"


# The llama3 rope scaling MaxText 0.2.5 hard-codes for llama3.1-style rotary embeddings (llama3.1-*, llama4-*).
MAXTEXT_LLAMA3_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192}


def llama3_scaling_mismatch(cfg: ModelConfig, scaling: dict[str, Any]) -> list[str]:
  """A warning when HF's llama3 rope scaling is not the one MaxText hard-codes."""
  differing = {k: (scaling.get(k), v) for k, v in MAXTEXT_LLAMA3_SCALING.items() if float(scaling.get(k, -1)) != v}
  if not differing:
    return []
  return [f"{cfg.path}: llama3 rope scaling {differing} (HF, MaxText): MaxText 0.2.5 hard-codes factor 8, low 1,"
          " high 4, original context 8192, so this checkpoint's logits cannot be reproduced exactly (the"
          " difference grows with the position)"]


def no_rope_scaling(cfg: ModelConfig, target: str) -> list[str]:
  scaling = rope_parameters(cfg)
  if rope_kind(scaling) != "default":
    return [f"{cfg.path}: rope scaling {scaling}; MaxText's {target} decoder applies none"]
  return []


def integer(cfg: ModelConfig, name: str, value: Any, warnings: list[str]) -> int:
  """MaxText declares some float-looking settings as ints (rope_factor, beta_fast): round, and say so if lossy."""
  rounded = int(round(float(value)))
  if float(value) != rounded:
    warnings.append(f"{cfg.path}: {name}={value} is not an integer, but MaxText's config declares it as one:"
                    f" {rounded} is used, so logits will differ from HF")
  return rounded


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
  return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_rope(cfg: ModelConfig, warnings: list[str], *, latent_attention: bool,
              scaling: dict[str, Any] | None = None) -> dict[str, Any]:
  """MaxText's YaRN keys for HF's rope scaling (DeepSeek, GPT-OSS); plain rope is YaRN with factor 1.

  HF scales cos/sin by `attention_factor` (by default mscale(factor, mscale) / mscale(factor, mscale_all_dim), or
  mscale(factor) without both) and, for DeepSeek's latent attention, the softmax by mscale(factor,
  mscale_all_dim)^2. MaxText has one switch for the first (`rope_attention_scaling`: mscale(factor) or 1) and, for
  latent attention, `mscale` for the second, applied only when max_position_embeddings exceeds the original.
  """
  scaling = rope_parameters(cfg) if scaling is None else scaling
  max_positions = int(cfg.get("max_position_embeddings") or 4096)
  if rope_kind(scaling) == "default":
    return {"rope_factor": 1, "original_max_position_embeddings": max_positions,
            "max_position_embeddings": max_positions, "rope_attention_scaling": False,
            **({"mscale": 1.0} if latent_attention else {})}
  if rope_kind(scaling) != "yarn":
    raise ConversionError(f"{cfg.path}: rope scaling {scaling}; MaxText's decoder for this family runs YaRN only")
  original = int(scaling.get("original_max_position_embeddings") or cfg.require("original_max_position_embeddings"))
  factor_value = scaling.get("factor") or max_positions / original
  factor = integer(cfg, "rope factor", factor_value, warnings)
  mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
  if scaling.get("attention_factor") is not None:
    cos_sin = float(scaling["attention_factor"])
  elif mscale and mscale_all_dim:
    cos_sin = _yarn_mscale(factor_value, mscale) / _yarn_mscale(factor_value, mscale_all_dim)
  else:
    cos_sin = _yarn_mscale(factor_value)
  attention_scaling = not math.isclose(cos_sin, 1.0, rel_tol=1e-6)
  if attention_scaling and not math.isclose(cos_sin, _yarn_mscale(factor), rel_tol=1e-6):
    warnings.append(f"{cfg.path}: YaRN scales cos/sin by {cos_sin:.6g} (mscale={mscale}, mscale_all_dim="
                    f"{mscale_all_dim}); MaxText scales them by 1 or 0.1*ln(factor)+1 only, so logits will differ")
  overrides = {
      "rope_factor": factor, "original_max_position_embeddings": original,
      "max_position_embeddings": max_positions,
      "beta_fast": integer(cfg, "beta_fast", scaling.get("beta_fast") or 32, warnings),
      "beta_slow": integer(cfg, "beta_slow", scaling.get("beta_slow") or 1, warnings),
      "rope_truncate": bool(scaling.get("truncate", True)), "rope_attention_scaling": attention_scaling,
  }
  if latent_attention:
    overrides["mscale"] = float(mscale_all_dim or 0.0)
    if mscale_all_dim and max_positions <= original and factor > 1:
      warnings.append(f"{cfg.path}: max_position_embeddings={max_positions} does not exceed the original"
                      f" {original}: MaxText then skips the YaRN softmax scale that HF applies")
  return overrides


# Gemma-style decoders: norm scales stored as w + offset, a scaled embedding table, norms around attention and MLP,
# several HF layers per MaxText layer, layers scanned in blocks.
def sandwich_norms(cfg: ModelConfig, rules: WeightRules, decoder: Decoder, suffix: str = "") -> tuple[Param, ...]:
  """Norms before attention and MLP, and (when the decoder names them) on their outputs.

  HF's `post_attention_layernorm` is the pre-MLP norm when there are no output norms (Gemma), else the norm on
  the attention output (Gemma 2/3, whose pre-MLP norm is `pre_feedforward_layernorm`).
  """
  E = cfg.hidden_size
  if decoder.post_attention_norm:
    hf_names = {decoder.pre_attention_norm: "input_layernorm",
                decoder.post_attention_norm: "post_attention_layernorm",
                decoder.pre_mlp_norm: "pre_feedforward_layernorm",
                decoder.post_mlp_norm: "post_feedforward_layernorm"}
  else:
    hf_names = {decoder.pre_attention_norm: "input_layernorm", decoder.pre_mlp_norm: "post_attention_layernorm"}
  return tuple(Param(f"{name}{suffix}/scale", f"{LAYER}.{hf}.weight", (E,), rules.norm())
               for name, hf in hf_names.items())


def sandwich_layer(cfg: ModelConfig, rules: WeightRules, decoder: Decoder, *, qk_norm: bool) -> tuple[Param, ...]:
  """One MaxText layer of norms + attention + dense MLP; with several sublayer suffixes (Gemma2's _local/_global)
  MaxText layer i holds HF layers n*i .. n*i + n-1, the k-th under the k-th suffix."""
  n = len(decoder.sublayer_suffixes)
  params = []
  for k, suffix in enumerate(decoder.sublayer_suffixes):
    sublayer = (sandwich_norms(cfg, rules, decoder, suffix)
                + attention(cfg, rules, prefix=f"self_attention{suffix}", qk_norm=qk_norm)
                + dense_mlp(cfg, f"mlp{suffix}"))
    params += [dataclasses.replace(p, layer_stride=n, layer_offset=k) for p in sublayer]
  return tuple(params)


def sublayered_num_layers(cfg: ModelConfig, decoder: Decoder) -> int:
  n = len(decoder.sublayer_suffixes)
  if cfg.num_layers % n:
    raise ConversionError(f"{cfg.path}: num_hidden_layers={cfg.num_layers} is not a multiple of {n}: MaxText's"
                          f" decoder pairs HF layers {n} to a layer ({', '.join(decoder.sublayer_suffixes)})")
  return cfg.num_layers // n


def block_layer_groups(params: tuple[Param, ...], block: int, num_layers: int,
                       scan_layers: bool) -> tuple[LayerGroup, ...]:
  """Scanned: `decoder/layers/layers_{j}` (j < block) stacking layers block*b + j on the scan axis, then the
  remainder unscanned under `decoder/layers_remainder/layers_{k}` (MaxText's gemma3). Unscanned: standard."""
  if not scan_layers:
    return standard_layer_groups(params, num_layers, scan_layers)
  blocks, remainder = divmod(num_layers, block)
  groups = [LayerGroup(("decoder", "layers", f"layers_{j}"), tuple(block * b + j for b in range(blocks)), True, params)
            for j in range(block if blocks else 0)]
  return tuple(groups + [LayerGroup(("decoder", "layers_remainder", f"layers_{k}"), (block * blocks + k,), False,
                                    params) for k in range(remainder)])


def layer_pattern(cfg: ModelConfig, decoder: Decoder, hf_pattern: int) -> None:
  """Refuses an HF `layer_types` (default: every `hf_pattern`-th layer global) that differs from the local/global
  pattern MaxText's decoder hard-codes."""
  default = ["full_attention" if (i + 1) % hf_pattern == 0 else "sliding_attention" for i in range(cfg.num_layers)]
  actual = list(cfg.get("layer_types") or default)
  expected = ["sliding_attention" if decoder.is_local(i) else "full_attention" for i in range(cfg.num_layers)]
  if actual != expected:
    raise ConversionError(f"{cfg.path}: layer_types {actual} differs from the local/global pattern MaxText's decoder"
                          f" hard-codes ({expected})")


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


def gemma_rules(cfg: ModelConfig, query_scale: float | None) -> WeightRules:
  return WeightRules(query_scale=query_scale, norm_offset=1.0, embedding_scale=math.sqrt(cfg.hidden_size))


def soft_cap(value) -> float:
  """HF's null soft cap is MaxText's 0.0 (off)."""
  return float(value) if value else 0.0
