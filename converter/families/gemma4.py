"""Gemma 4 (`gemma4-26b` MoE, `gemma4-31b` dense) from `Gemma4ForCausalLM` or the hub's
`Gemma4ForConditionalGeneration`, whose vision tower and embedder convert too (converter/families/towers/
gemma4_vision.py; `--text_only` leaves them out). MaxText 0.2.5 has no Gemma 4 audio encoder, so an audio tower and
its embedder (`model.audio_tower.*`, `model.embed_audio.*`) are skipped, saying so.

Unlike Gemma 1-3 the norms are plain scales (HF's `Gemma4RMSNorm` is x * w): stored as they are. The embedding holds
sqrt(E) as before (tied logits are divided by it at run time); queries are not scaled (HF's scaling is 1). Five
sliding-window layers then one global layer, whose heads are larger and fewer (`global_head_dim`,
`global_num_kv_heads`) and rotate only a fraction of each head ("proportional" rope); with `attention_k_eq_v` a global
layer has no value projection (its values are its raw keys). Each layer's output is scaled by its `layer_scalar`.
In MoE layers the dense MLP is the shared expert beside the routed ones, whose gate and up projections share one HF
tensor (X, 2M, E), gate rows first. Scanned, MaxText stacks blocks of 6: the sliding layers in
`scanned_blocks/local_layers` (block, layer in block), the global ones in `scanned_blocks/global_layer`, layers past
the last block in `layers_remainder/local_layers`.

The pieces both Gemma 4 decoders share (config parsing, attention, norms, checks, overrides) live here;
gemma4_small.py adds per-layer embeddings and KV sharing.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from converter import ops
from converter.errors import ConversionError
from converter.families import common
from converter.families.base import ROTARY_CACHES, Family, LayerGroup, Layout, Param, Towers
from converter.families.runtime import Decoder, Runtime
from converter.families.towers import gemma4_vision
from converter.model_config import ModelConfig

MULTIMODAL = "Gemma4ForConditionalGeneration"
ARCHITECTURES = ("Gemma4ForCausalLM", MULTIMODAL)
PATTERN = (True,) * 5 + (False,)  # MaxText's GEMMA4_ATTENTION_PATTERN: layer i is global iff i % 6 == 5.
MOE, DENSE = "gemma4-26b", "gemma4-31b"
# transformers 5.24's Gemma4TextConfig defaults, for keys a config.json may leave out.
HF_DEFAULTS = dict(sliding_window=512, hidden_size_per_layer_input=256, vocab_size_per_layer_input=262144,
                   num_kv_shared_layers=0, attention_k_eq_v=False, enable_moe_block=False, use_double_wide_mlp=False,
                   global_head_dim=512, hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None,
                   use_bidirectional_attention=None, attention_bias=False)
HF_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
           "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}


def hf(cfg: ModelConfig, key: str) -> Any:
  return cfg.get(key, HF_DEFAULTS[key])


def text_model(cfg: ModelConfig) -> str:
  """Where the text model's tensors are: `model.language_model` in the multimodal checkpoint, else `model`."""
  return "model.language_model" if cfg.architecture == MULTIMODAL else "model"


def is_small(cfg: ModelConfig) -> bool:
  """Per-layer embeddings or KV-shared layers: MaxText's gemma4_small decoder (gemma4_small.py)."""
  return bool(hf(cfg, "hidden_size_per_layer_input")) or int(hf(cfg, "num_kv_shared_layers")) > 0


def layer_types(cfg: ModelConfig) -> list[str]:
  """transformers' layer types: config.json's (default: every sixth layer full attention), the last layer always
  full attention (Gemma4TextConfig forces it, with a warning)."""
  types = list(cfg.get("layer_types") or ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                          for i in range(cfg.num_layers)])
  types[-1] = "full_attention"
  return types


def check_layer_pattern(cfg: ModelConfig, decoder: Decoder, target: str) -> None:
  """Refuses HF layer types that differ from the sliding/global pattern MaxText's decoder hard-codes."""
  actual = layer_types(cfg)
  expected = ["sliding_attention" if decoder.is_local(i) else "full_attention" for i in range(cfg.num_layers)]
  if actual != expected:
    period = len(decoder.local_layers)
    hint = (f"; num_hidden_layers={cfg.num_layers} is not a multiple of {period}, and transformers always makes the"
            " last layer full attention, so no MaxText Gemma 4 model computes this checkpoint"
            if cfg.num_layers % period else "")
    raise ConversionError(f"{cfg.path}: layer_types {actual} differs from the pattern MaxText's {target} hard-codes"
                          f" (one global layer every {period}: {expected}){hint}")


def layer_dims(cfg: ModelConfig) -> list[tuple[int, int]]:
  """(head_dim, kv heads) of every layer as transformers builds it: `per_layer_config` (as transformers 5.24 saves
  configs) overrides single layers; hub configs give full-attention layers `global_head_dim` and, with
  `attention_k_eq_v`, `num_global_key_value_heads`."""
  per_layer = cfg.get("per_layer_config")
  if per_layer is None:
    override = {"head_dim": hf(cfg, "global_head_dim")}
    if hf(cfg, "attention_k_eq_v") and cfg.get("num_global_key_value_heads") is not None:
      override["num_key_value_heads"] = cfg.get("num_global_key_value_heads")
    per_layer = {i: override for i, kind in enumerate(layer_types(cfg)) if kind == "full_attention"}
  overrides = {int(layer): dict(values) for layer, values in per_layer.items()}
  unknown = sorted({key for values in overrides.values() for key in values} - {"head_dim", "num_key_value_heads"})
  if unknown:
    raise ConversionError(f"{cfg.path}: per_layer_config sets {unknown}; MaxText's Gemma 4 decoders vary only"
                          " head_dim and num_key_value_heads, between sliding and global layers")
  return [(int(overrides.get(i, {}).get("head_dim", cfg.head_dim)),
           int(overrides.get(i, {}).get("num_key_value_heads", cfg.num_kv_heads))) for i in range(cfg.num_layers)]


def head_dims(cfg: ModelConfig) -> tuple[tuple[int, int], tuple[int, int]]:
  """(head_dim, kv heads) of the sliding layers and of the (last) full-attention layer."""
  full = next(d for d, kind in zip(reversed(layer_dims(cfg)), reversed(layer_types(cfg))) if kind == "full_attention")
  return (cfg.head_dim, cfg.num_kv_heads), full


def check_head_dims(cfg: ModelConfig) -> None:
  """Refuses a layer whose size differs from its kind's (MaxText has one size for sliding, one for global layers)."""
  local, full = head_dims(cfg)
  for i, (kind, dims) in enumerate(zip(layer_types(cfg), layer_dims(cfg))):
    expected = full if kind == "full_attention" else local
    if dims != expected:
      raise ConversionError(f"{cfg.path}: layer {i} ({kind}) has head_dim {dims[0]} and {dims[1]} KV heads, other"
                            f" {kind} layers {expected[0]} and {expected[1]}; MaxText has one size per kind")
  if cfg.num_heads % full[1]:
    raise ConversionError(f"{cfg.path}: num_attention_heads {cfg.num_heads} is not a multiple of the global layers'"
                          f" {full[1]} KV heads")


def rope(cfg: ModelConfig, warnings: list[str] | None = None) -> dict[str, tuple[float, float]]:
  """(theta, fraction of each head rotated) per layer type from `rope_parameters` (transformers' defaults when
  absent). MaxText has plain rope on all of a head or, like HF's "proportional", on its first fraction; with
  `warnings`, says what else it cannot reproduce."""
  params = cfg.get("rope_parameters") or HF_ROPE
  result = {}
  for kind in ("sliding_attention", "full_attention"):
    if not isinstance(params.get(kind), dict):
      raise ConversionError(f"{cfg.path}: rope_parameters has no {kind!r} entry; transformers' Gemma 4 reads rope"
                            " settings per layer type")
    rope_type = common.rope_kind(params[kind])
    fraction = float(params[kind].get("partial_rotary_factor", 1.0)) if rope_type == "proportional" else 1.0
    result[kind] = (float(params[kind].get("rope_theta", HF_ROPE[kind]["rope_theta"])), fraction)
    if warnings is not None and (rope_type not in ("default", "proportional") or params[kind].get("factor", 1) != 1):
      warnings.append(f"{cfg.path}: {kind} rope {params[kind]}; MaxText's Gemma 4 has only unscaled default and"
                      " proportional rope, so logits will differ from HF")
  return result


def checks(cfg: ModelConfig, target: str, decoder: Decoder) -> list[str]:
  """What both Gemma 4 decoders refuse (layer pattern, head sizes, biases) and what they fix whatever the config
  says: layer norms with epsilon 1e-6, gelu (tanh), causal attention."""
  check_layer_pattern(cfg, decoder, target)
  check_head_dims(cfg)
  if hf(cfg, "attention_bias"):
    raise ConversionError(f"{cfg.path}: attention_bias is true; MaxText's {target} attention has no biases")
  warnings: list[str] = []
  if cfg.rms_norm_eps != 1e-6:
    warnings.append(f"{cfg.path}: rms_norm_eps={cfg.rms_norm_eps}, but MaxText's {target} layer norms use 1e-6"
                    " whatever normalization_layer_epsilon says: logits will differ slightly from HF")
  if hf(cfg, "hidden_activation") not in ("gelu_pytorch_tanh", "gelu_new"):
    warnings.append(f"{cfg.path}: hidden_activation={hf(cfg, 'hidden_activation')!r}; MaxText's {target} uses gelu"
                    " with the tanh approximation")
  if hf(cfg, "use_bidirectional_attention") == "all":  # "vision" changes nothing for text.
    warnings.append(f"{cfg.path}: use_bidirectional_attention is 'all'; MaxText's {target} text decoder is causal")
  if not cfg.tie_word_embeddings and hf(cfg, "final_logit_softcapping"):
    warnings.append(f"{cfg.path}: untied embeddings: MaxText applies final_logits_soft_cap to tied logits only")
  rope(cfg, warnings)
  return warnings


def decoder(pattern: tuple[bool, ...], *, moe: bool = False) -> Decoder:
  return Decoder(
      query_scale=1.0, qk_norm="rms", pre_attention_norm="pre_self_attention_norm", pre_mlp_norm="pre_ffw_norm",
      post_attention_norm="post_self_attention_norm", post_mlp_norm="post_ffw_norm", layer_norm_epsilon=1e-6,
      mlp_activation="gelu_tanh", routing="gemma4" if moe else "", moe_block="moe_block" if moe else "",
      local_layers=pattern, forward="gemma4")


def overrides(cfg: ModelConfig) -> dict[str, Any]:
  """The MaxText keys both Gemma 4 decoders need beyond the dimensions."""
  thetas = rope(cfg)
  (local_theta, local_fraction), (global_theta, global_fraction) = thetas["sliding_attention"], thetas["full_attention"]
  _, (global_head_dim, global_kv_heads) = head_dims(cfg)
  return dict(
      normalize_embedding_logits=True, sliding_window_size=int(hf(cfg, "sliding_window")),
      final_logits_soft_cap=common.soft_cap(hf(cfg, "final_logit_softcapping")), rope_max_timescale=global_theta,
      local_rope_max_timescale=local_theta, use_multimodal=False, global_head_dim=global_head_dim,
      global_num_kv_heads=global_kv_heads, global_rope_max_timescale=global_theta,
      global_rope_proportion=global_fraction, local_rope_proportion=local_fraction,
  )


def rules(cfg: ModelConfig) -> common.WeightRules:
  return common.WeightRules(embedding_scale=math.sqrt(cfg.hidden_size))  # Norms as they are: no offset.


def norms(cfg: ModelConfig, layer: str, dec: Decoder) -> tuple[Param, ...]:
  """The four sandwich norms and the layer's output scale."""
  E = cfg.hidden_size
  names = {dec.pre_attention_norm: "input_layernorm", dec.post_attention_norm: "post_attention_layernorm",
           dec.pre_mlp_norm: "pre_feedforward_layernorm", dec.post_mlp_norm: "post_feedforward_layernorm"}
  return tuple(Param(f"{name}/scale", f"{layer}.{hf_name}.weight", (E,)) for name, hf_name in names.items()) + (
      Param("layer_scalar", f"{layer}.layer_scalar", (1,)),)


def attention(cfg: ModelConfig, layer: str, dims: tuple[int, int], *, keys: bool = True,
              values: bool = True) -> tuple[Param, ...]:
  """q/k/v/o in heads of the layer's size and the q/k norms (the value norm has no scale); no keys or values in a
  KV-shared layer, no values in a global layer whose values are its keys."""
  E, H = cfg.hidden_size, cfg.num_heads
  D, KV = dims
  hf_attention, p = f"{layer}.self_attn", "self_attention"
  params = [
      Param(f"{p}/query/kernel", f"{hf_attention}.q_proj.weight", (H * D, E), ops.to_heads_kernel(E, H, D)),
      Param(f"{p}/query_norm/scale", f"{hf_attention}.q_norm.weight", (D,)),
      Param(f"{p}/out/kernel", f"{hf_attention}.o_proj.weight", (E, H * D), ops.to_out_kernel(E, H, D)),
  ]
  if keys:
    params += [Param(f"{p}/key/kernel", f"{hf_attention}.k_proj.weight", (KV * D, E), ops.to_heads_kernel(E, KV, D)),
               Param(f"{p}/key_norm/scale", f"{hf_attention}.k_norm.weight", (D,))]
  if keys and values:
    params.append(Param(f"{p}/value/kernel", f"{hf_attention}.v_proj.weight", (KV * D, E),
                        ops.to_heads_kernel(E, KV, D)))
  return tuple(params)


def layer_groups(params_of_layer: Callable[[int], tuple[Param, ...]], cfg: ModelConfig,
                 scan_layers: bool) -> tuple[LayerGroup, ...]:
  """Unscanned `decoder/layers_{i}`; scanned, MaxText's blocks of 6 (see the module docstring)."""
  L = cfg.num_layers
  if not scan_layers:
    return tuple(LayerGroup(("decoder", f"layers_{i}"), (i,), False, params_of_layer(i)) for i in range(L))
  blocks, rest = divmod(L, len(PATTERN))
  groups = []
  if blocks:
    starts = range(0, blocks * len(PATTERN), len(PATTERN))
    groups += [LayerGroup(("decoder", "scanned_blocks", "local_layers"), tuple(tuple(range(b, b + 5)) for b in starts),
                          True, params_of_layer(0)),
               LayerGroup(("decoder", "scanned_blocks", "global_layer"), tuple(b + 5 for b in starts), True,
                          params_of_layer(5))]
  if rest:
    groups.append(LayerGroup(("decoder", "layers_remainder", "local_layers"), tuple(range(L - rest, L)), True,
                             params_of_layer(L - rest)))
  return tuple(groups)


def has_vision(cfg: ModelConfig) -> bool:
  """A multimodal checkpoint with a vision tower (config.json's `vision_config`)."""
  return cfg.architecture == MULTIMODAL and isinstance(cfg.get("vision_config"), dict)


def ignored(cfg: ModelConfig) -> dict[str, str]:
  """Rotary caches and, in a multimodal checkpoint, the audio tower and its embedder: no MaxText Gemma 4 model
  has an audio encoder (MaxText 0.2.5's AudioEncoder knows only Qwen3-Omni's)."""
  ignored_tensors = dict(ROTARY_CACHES)
  if cfg.architecture == MULTIMODAL:
    ignored_tensors[r"model\.(audio_tower|embed_audio)\."] = (
        "Gemma 4's audio tower and its embedder: MaxText 0.2.5 has no Gemma 4 audio encoder (the converted model"
        " takes no audio)")
  return ignored_tensors


def _moe(cfg: ModelConfig) -> bool:
  return bool(hf(cfg, "enable_moe_block"))


def _experts(cfg: ModelConfig, layer: str) -> tuple[Param, ...]:
  """The shared expert (HF's dense MLP), the router (projection, input scale, per-expert scale) and the routed
  experts: gate_up_proj (X, 2M, E) split into its halves of rows, each transposed; down_proj (X, E, M) transposed."""
  E, X, M = cfg.hidden_size, int(cfg.require("num_experts")), int(cfg.require("moe_intermediate_size"))
  router, experts, block = f"{layer}.router", f"{layer}.experts", "mlp/moe_block/MoeBlock_0"
  gate_up = f"{experts}.gate_up_proj"
  return common.dense_mlp(cfg, "mlp/moe_block/shared_experts", f"{layer}.mlp") + (
      Param(f"{block}/gate/kernel", f"{router}.proj.weight", (X, E), (ops.Transpose(),)),
      Param("mlp/pre_forward_scale_2", f"{router}.scale", (E,)),
      Param(f"{block}/per_expert_scale", f"{router}.per_expert_scale", (X,)),
      *(Param(f"{block}/wi_{k}", gate_up, (X, 2 * M, E), (ops.halves(k, 2, 2 * M, axis=0), ops.Transpose()),
              experts=X, experts_in_tensor=True) for k in (0, 1)),
      Param(f"{block}/wo", f"{experts}.down_proj", (X, E, M), (ops.Transpose(),), experts=X, experts_in_tensor=True),
      *(Param(f"mlp/{norm}/scale", f"{layer}.{norm}.weight", (E,))
        for norm in ("pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2")),
  )


def _layer(cfg: ModelConfig, i: int) -> tuple[Param, ...]:
  layer = f"{text_model(cfg)}.layers.{{layer}}"
  local = PATTERN[i % len(PATTERN)]
  local_dims, global_dims = head_dims(cfg)
  mlp = _experts(cfg, layer) if _moe(cfg) else common.dense_mlp(cfg, "mlp", f"{layer}.mlp")
  return (norms(cfg, layer, decoder(PATTERN))
          + attention(cfg, layer, local_dims if local else global_dims,
                      values=local or not hf(cfg, "attention_k_eq_v"))
          + mlp)


def _layout(cfg: ModelConfig, target: str, target_vocab: int, scan_layers: bool) -> Layout:
  return Layout(common.embeddings(cfg, target_vocab, rules(cfg), model=text_model(cfg)),
                layer_groups(lambda i: _layer(cfg, i), cfg, scan_layers))


def _runtime(cfg: ModelConfig, target: str) -> Runtime:
  if _moe(cfg):
    experts = dict(num_experts=int(cfg.require("num_experts")), num_experts_per_tok=int(cfg.require("top_k_experts")),
                   base_moe_mlp_dim=int(cfg.require("moe_intermediate_size")), shared_experts=1, norm_topk_prob=True)
  else:
    experts = dict(num_experts=1)  # Whichever model name: the 26b config would otherwise build 128 experts.
  return common.runtime(cfg, decoder(PATTERN, moe=_moe(cfg)), **overrides(cfg), **experts,
                        share_kv_projections=bool(hf(cfg, "attention_k_eq_v")))


def _towers(cfg: ModelConfig, target: str) -> Towers | None:
  return gemma4_vision.towers(cfg) if has_vision(cfg) else None


def _check(cfg: ModelConfig, target: str) -> list[str]:
  warnings = checks(cfg, target, decoder(PATTERN))
  return warnings + (gemma4_vision.warnings(cfg) if has_vision(cfg) else [])


FAMILY = Family(
    name="gemma4",
    architectures=ARCHITECTURES,
    targets=(MOE, DENSE),
    infer_target=lambda cfg: MOE if _moe(cfg) else DENSE,
    runtime=_runtime,
    layout=_layout,
    check=_check,
    ignored_tensors=ignored,
    reads=lambda cfg: not is_small(cfg),
    towers=_towers,
)
