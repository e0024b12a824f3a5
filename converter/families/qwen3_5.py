"""Qwen3.5-MoE (`qwen3.5-*`), from `Qwen3_5MoeForCausalLM` or the hub's `Qwen3_5MoeForConditionalGeneration` (text
under `model.language_model.`, the vision tower under `model.visual.`, converted with it: the Qwen vision tower
without deepstack mergers, converter/families/towers/qwen_vision.py; `mtp.*` is skipped): Qwen3-Next's hybrid decoder
(converter/families/hybrid.py) with the linear attention's projections stored apart.

HF keeps `in_proj_qkv` flat ([q of every key head | k | v]) and `in_proj_z`, `in_proj_b`, `in_proj_a` separate;
MaxText's `in_proj_qkvz` / `in_proj_ba` regroup them per key head ([q, k, v, z] and [b, a] for each), so each
source fills its slot of the packed leaf (a plain concatenation keeps the shape and is right only for one key
head). Routed experts come one by one (transformers 5.24's `save_pretrained`) or fused (`gate_up_proj` with the
gate's rows first, `down_proj`; the hub repos): both are read, the reverse direction writes them one by one.
Scanned, MaxText groups layers by their place in the cycle: `decoder/layers/layer_{k}` holds HF layers k, k + c, ...
The tower has no deepstack mergers, so the decoder scans with it as without it.
FP8 checkpoints (`Qwen3.5-*-FP8`) are read through the fp8 source, dequantized to the save dtype (the tower, which
the hub repos leave unquantized, converted as usual), or kept in FP8 for MaxText's `qwen3.5-*-fp8` models
(`--keep_fp8`; its unquantized modules are listed below, as its configs say). Those names have no multimodal form
(configs/types.py refuses use_multimodal for them): targeting one leaves the tower out, with a warning.
"""

from converter import ops
from converter.families import common, hybrid
from converter.families.base import ROTARY_CACHES, Alternatives, Family, LayerGroup, Layout, Param, Towers
from converter.families.runtime import Runtime
from converter.families.towers import qwen_vision
from converter.model_config import ModelConfig

MULTIMODAL = "Qwen3_5MoeForConditionalGeneration"


def _prefix(cfg: ModelConfig) -> str:
  return "model.language_model" if cfg.architecture == MULTIMODAL else "model"


def _linear(cfg: ModelConfig, layer: str) -> tuple[Param, ...]:
  d = hybrid.gdn_dims(cfg)
  Hk, Dk, Dv, r, E = d["Hk"], d["Dk"], d["Dv"], d["r"], cfg.hidden_size
  hf = f"{layer}.linear_attn"
  qkv = (Hk * Dk, Hk * Dk, d["Hv"] * Dv)
  qkvz_slots = (Dk, Dk, r * Dv, r * Dv)
  qkvz = tuple(
      Param("attention/in_proj_qkvz/kernel", f"{hf}.in_proj_qkv.weight", (sum(qkv), E),
            (ops.Slot(0, 1, qkv, k), ops.Transpose()), leaf_slot=ops.Slot(-1, Hk, qkvz_slots, k))
      for k in range(3)
  ) + (Param("attention/in_proj_qkvz/kernel", f"{hf}.in_proj_z.weight", (d["Hv"] * Dv, E), (ops.Transpose(),),
             leaf_slot=ops.Slot(-1, Hk, qkvz_slots, 3)),)
  ba = tuple(
      Param("attention/in_proj_ba/kernel", f"{hf}.in_proj_{name}.weight", (d["Hv"], E), (ops.Transpose(),),
            leaf_slot=ops.Slot(-1, Hk, (r, r), k))
      for k, name in enumerate("ba")
  )
  return hybrid.linear_attention(cfg, layer, qkvz, ba)


def _fused_experts(cfg: ModelConfig, layer: str) -> tuple[Param, ...]:
  """`mlp.experts.gate_up_proj` (X, 2M, E) with the gate's rows first and `down_proj` (X, E, M), stored (out, in)."""
  X, E, M = hybrid.num_experts(cfg), cfg.hidden_size, int(cfg.require("moe_intermediate_size"))
  experts, p = f"{layer}.mlp.experts", "mlp/routed_experts"
  return (
      Param(f"{p}/gate/kernel", f"{layer}.mlp.gate.weight", (X, E), (ops.Transpose(),)),
      *(Param(f"{p}/wi_{k}", f"{experts}.gate_up_proj", (X, 2 * M, E), (ops.halves(k, 2, 2 * M, axis=0),
                                                                         ops.Transpose()),
              experts=X, experts_in_tensor=True) for k in range(2)),
      Param(f"{p}/wo", f"{experts}.down_proj", (X, E, M), (ops.Transpose(),), experts=X, experts_in_tensor=True),
  )


def _layer(cfg: ModelConfig, i: int) -> tuple:
  layer = f"{_prefix(cfg)}.layers.{{layer}}"
  attention = hybrid.full_attention(cfg, layer) if hybrid.is_full_attention(cfg, i) else _linear(cfg, layer)
  routed = Alternatives((hybrid.per_expert(cfg, layer), _fused_experts(cfg, layer)))
  return attention + hybrid.moe(cfg, layer, (routed,))


def _layout(cfg: ModelConfig, target: str, target_vocab: int, scan_layers: bool) -> Layout:
  c, L = hybrid.cycle(cfg), cfg.num_layers
  if scan_layers:
    groups = tuple(LayerGroup(("decoder", "layers", f"layer_{k}"), tuple(range(k, L, c)), True, _layer(cfg, k))
                   for k in range(c))
  else:
    groups = tuple(LayerGroup(("decoder", f"layers_{i}"), (i,), False, _layer(cfg, i)) for i in range(L))
  return Layout(common.embeddings(cfg, target_vocab, model=_prefix(cfg)), groups)


def _mrope_section(cfg: ModelConfig) -> tuple[int, ...]:
  """Text-only positions are equal in all three sections, so any split gives plain rope; MaxText only needs one
  that covers the rotary half-dimensions."""
  section = common.rope_parameters(cfg).get("mrope_section")
  if section:
    return tuple(int(s) for s in section)
  half = int(cfg.head_dim * hybrid.partial_rotary_factor(cfg)) // 2
  return (half - 2 * (half // 3), half // 3, half // 3)


def _runtime(cfg: ModelConfig, target: str) -> Runtime:
  return common.runtime(cfg, hybrid.DECODER, use_multimodal=False, use_mrope=True, mrope_section=_mrope_section(cfg),
                        **hybrid.overrides(cfg))


def _towers(cfg: ModelConfig, target: str) -> Towers | None:
  """The wrapper's tower, except for the fp8 names, which have no multimodal form (`_check` says so)."""
  if cfg.architecture != MULTIMODAL or target.endswith("-fp8"):
    return None
  return qwen_vision.towers(cfg, prefix="model.visual", kind=qwen_vision.QWEN3_5)


def _check(cfg: ModelConfig, target: str) -> list[str]:
  warnings = hybrid.checks(cfg, target)
  if cfg.architecture == MULTIMODAL and target.endswith("-fp8"):
    warnings.append(f"{cfg.path}: --target_model={target}: MaxText 0.2.5's fp8 models take no use_multimodal, so"
                    " the vision tower (model.visual.*) is not converted; target the name without -fp8 to convert"
                    " it")
  return warnings


def _ignored(cfg: ModelConfig) -> dict[str, str]:
  """`mtp.*` always; the tower where the target has no multimodal form (the fp8 names)."""
  return {**ROTARY_CACHES, r"mtp\.": "the multi-token-prediction module, which MaxText's model does not have",
          r"model\.visual\.": "the vision tower, which MaxText's fp8 models cannot run"}


FAMILY = Family(
    name="qwen3_5",
    architectures=("Qwen3_5MoeForCausalLM", MULTIMODAL),
    targets=("qwen3.5",),
    infer_target=common.single_target("qwen3.5"),
    runtime=_runtime,
    layout=_layout,
    check=_check,
    ignored_tensors=_ignored,
    towers=_towers,
    fp8_unquantized_modules=("token_embedder", "logits_dense", "gate", "shared_expert_gate", "conv1d", "in_proj_ba",
                             "A_log", "dt_bias", "norm"),
)
