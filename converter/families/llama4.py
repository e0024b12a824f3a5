"""Llama 4 (`llama4-17b-16e` Scout-like, `llama4-17b-128e` Maverick-like), from `Llama4ForCausalLM` or the hub's
`Llama4ForConditionalGeneration`, whose vision tower, pixel-shuffle adapter and projector convert too
(converter/families/towers/llama4_vision.py; `--text_only` leaves them out).

MoE layers every `interleave_moe_layer_step` layers (the others dense), each a sigmoid top-1 router, experts fused in
HF tensors that already hold every expert (gate and up are the two halves of `gate_up_proj`) and one shared expert;
NoPE layers every `no_rope_layer_interval` with global attention, chunked attention elsewhere; query and key L2
norms on rope layers; no query scale baked in and no rotary permutation (HF rotates adjacent pairs, as MaxText's
llama3.1 rotary embedding). Scanned, MaxText stacks layers in four strided blocks: HF layer i is in
`decoder/layers/layers_{i % 4}`.
"""

import math

from converter import ops
from converter.errors import ConversionError
from converter.families import common
from converter.families.base import Family, Layout, Param, Towers
from converter.families.runtime import Decoder, Runtime
from converter.families.towers import llama4_vision
from converter.model_config import ModelConfig

MULTIMODAL = "Llama4ForConditionalGeneration"
MOE = "Llama4MoEBlock_0"
DECODER = Decoder(rope="llama3.1", qk_norm="l2", routing="llama4", moe_block=MOE)


def _prefix(cfg: ModelConfig) -> str:
  return "language_model." if cfg.architecture == MULTIMODAL else ""


def _step(cfg: ModelConfig) -> int:
  return int(cfg.get("interleave_moe_layer_step") or 1)


def _nope_interval(cfg: ModelConfig) -> int:
  """HF's `no_rope_layers[i]` is 1 where layer i uses rope; MaxText's layer is NoPE when (i+1) % interval == 0."""
  flags = cfg.get("no_rope_layers")
  interval = cfg.get("no_rope_layer_interval")
  if not flags:
    return int(interval) if interval else -1
  if all(flags):
    return -1
  interval = int(interval or next(i + 1 for i, f in enumerate(flags) if not f))
  if list(flags) != [int((i + 1) % interval != 0) for i in range(len(flags))]:
    raise ConversionError(f"{cfg.path}: no_rope_layers {flags} is not every {interval}-th layer, the only NoPE"
                          " pattern MaxText's llama4 decoder (nope_layer_interval) has")
  return interval


def _cycle(cfg: ModelConfig) -> int:
  nope = _nope_interval(cfg)
  return math.lcm(_step(cfg), nope if nope > 0 else 1)


def _is_moe(cfg: ModelConfig, layer: int) -> bool:
  return (layer + 1) % _step(cfg) == 0


def _layer(cfg: ModelConfig, layer: int) -> tuple[Param, ...]:
  E, X, M = cfg.hidden_size, int(cfg.require("num_local_experts")), cfg.intermediate_size
  hf = f"{_prefix(cfg)}{common.LAYER}"
  params = common.layer_norms(cfg, hf) + common.attention(cfg, common.WeightRules(), hf=f"{hf}.self_attn")
  if not _is_moe(cfg, layer):
    return params + common.dense_mlp(cfg, "mlp", f"{hf}.feed_forward", int(cfg.require("intermediate_size_mlp")))
  ff = f"{hf}.feed_forward"
  return params + (
      Param(f"{MOE}/MoeBlock_0/gate/kernel", f"{ff}.router.weight", (X, E), (ops.Transpose(),)),
      *common.fused_experts(f"{MOE}/MoeBlock_0", f"{ff}.experts.gate_up_proj", f"{ff}.experts.down_proj", experts=X,
                            hidden=E, expert_dim=M, interleaved=False),
      *common.dense_mlp(cfg, f"{MOE}/shared_experts", f"{ff}.shared_expert", M),
  )


def _layout(cfg: ModelConfig, target: str, target_vocab: int, scan_layers: bool) -> Layout:
  prefix = _prefix(cfg)
  top = common.embeddings(cfg, target_vocab, model=f"{prefix}model", lm_head=f"{prefix}lm_head.weight")
  return Layout(top, common.strided_block_groups(lambda i: _layer(cfg, i), cycle=_cycle(cfg), num_layers=cfg.num_layers,
                                                 scan_layers=scan_layers, config_path=cfg.path))


def _rope_use_scale(cfg: ModelConfig, warnings: list[str]) -> bool:
  scaling = common.rope_parameters(cfg)
  kind = common.rope_kind(scaling)
  if kind == "default":
    return False
  if kind != "llama3":
    warnings.append(f"{cfg.path}: rope scaling {scaling}; MaxText's llama4 rotary embedding has only the llama3 one")
    return False
  warnings += common.llama3_scaling_mismatch(cfg, scaling)
  return True


def _runtime(cfg: ModelConfig, target: str) -> Runtime:
  return common.runtime(
      cfg, DECODER, base_mlp_dim=int(cfg.require("intermediate_size_mlp")), base_moe_mlp_dim=cfg.intermediate_size,
      num_experts=int(cfg.require("num_local_experts")), num_experts_per_tok=int(cfg.require("num_experts_per_tok")),
      shared_experts=1, rope_use_scale=_rope_use_scale(cfg, []), use_qk_norm=bool(cfg.get("use_qk_norm")),
      nope_layer_interval=_nope_interval(cfg), interleave_moe_layer_step=_step(cfg),
      chunk_attn_window_size=int(cfg.get("attention_chunk_size") or 0),
      temperature_tuning=bool(cfg.get("attn_temperature_tuning", True)), use_multimodal=False,
      inhomogeneous_layer_cycle_interval=_cycle(cfg))


def _check(cfg: ModelConfig, target: str) -> list[str]:
  if cfg.get("attention_bias"):
    raise ConversionError(f"{cfg.path}: attention_bias is true; MaxText's llama4 attention has no biases")
  moe_layers = cfg.get("moe_layers")
  expected = [i for i in range(cfg.num_layers) if _is_moe(cfg, i)]
  if moe_layers is not None and list(moe_layers) != expected:
    raise ConversionError(f"{cfg.path}: moe_layers {moe_layers} is not every {_step(cfg)}-th layer"
                          f" ({expected}), the only pattern MaxText's llama4 decoder (interleave_moe_layer_step) has")
  warnings: list[str] = []
  _rope_use_scale(cfg, warnings)
  for key, maxtext in (("attn_scale", 0.1), ("floor_scale", 8192)):
    if cfg.get(key) is not None and float(cfg.get(key)) != maxtext:
      warnings.append(f"{cfg.path}: {key}={cfg.get(key)}; MaxText's temperature tuning hard-codes {maxtext}")
  if _cycle(cfg) != 4:
    warnings.append(f"{cfg.path}: layers repeat every {_cycle(cfg)} (MoE step {_step(cfg)}, NoPE interval"
                    f" {_nope_interval(cfg)}); MaxText's llama4 configs all use 4, other cycles are untested")
  return warnings


def _towers(cfg: ModelConfig, target: str) -> Towers | None:
  return llama4_vision.towers(cfg) if cfg.architecture == MULTIMODAL else None


FAMILY = Family(
    name="llama4",
    architectures=("Llama4ForCausalLM", MULTIMODAL),
    targets=("llama4",),
    infer_target=lambda cfg: "llama4-17b-128e" if _step(cfg) > 1 else "llama4-17b-16e",
    runtime=_runtime,
    layout=_layout,
    check=_check,
    towers=_towers,
)
