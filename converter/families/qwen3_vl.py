"""Qwen3-VL (`Qwen3VLForConditionalGeneration`, dense; `Qwen3VLMoeForConditionalGeneration`, MoE): the Qwen3 text
decoder under `model.language_model.` with interleaved MRoPE, and the Qwen vision tower with deepstack mergers
(converter/families/towers/qwen_vision.py) under `model.visual.`.

MaxText names: qwen3-vl-2b / qwen3-vl-4b (dense, tied in their ymls; an untied dense checkpoint runs as qwen3-vl-4b
with logits_via_embedding=false, its `lm_head.weight` converted) and qwen3-vl-30b-a3b (MoE, untied). The dense
decoder is Qwen3's (converter/families/qwen3.py), the MoE decoder Qwen3-MoE's (qwen3_moe.py) except that the experts
are fused: the hub stores `mlp.experts.gate_up_proj` (X, E, 2M) (gate columns first) and `down_proj` (X, M, E),
already (in, out), while transformers 5.24 keeps (X, 2M, E) / (X, E, M) in memory and writes that. Both are read,
told apart by shape: gate_up's shapes coincide when E = 2M, but down_proj's then differ (they coincide only when
E = M), so the pair always decides. The reverse direction writes transformers 5.24's form, as it saves it (it
transposes the hub's on load only where the dims tell, which they do not when E = 2M). transformers' Qwen3-VL-MoE
router always renormalises its top-k weights (no `norm_topk_prob` key), as MaxText does.

Unscanned only when the tower is converted: MaxText injects the deepstack mergers' features between decoder layers
and refuses `deepstack_visual_indexes_for_vit` with scan_layers=true (configs/types.py; the model ymls set
scan_layers: false). With --text_only the checkpoint runs under the same names with use_multimodal=false and
deepstack_visual_indexes_for_vit=[] (nothing to inject without the tower), so it scans too; MRoPE then sees equal
positions in its three sections, which is plain rope, as transformers computes for text alone.
"""

from __future__ import annotations

from converter import ops
from converter.errors import ConversionError
from converter.families import common, qwen3, qwen3_moe
from converter.families.base import Alternatives, Family, Layout, Param, Towers, standard_layer_groups
from converter.families.runtime import Runtime
from converter.families.towers import qwen_vision
from converter.model_config import ModelConfig

DENSE = "Qwen3VLForConditionalGeneration"
MOE = "Qwen3VLMoeForConditionalGeneration"
TEXT = "model.language_model."
DENSE_TARGETS = ("qwen3-vl-2b", "qwen3-vl-4b")
MOE_TARGETS = ("qwen3-vl-30b-a3b",)
HF_DEFAULT_MROPE_SECTION = (24, 20, 20)  # transformers' Qwen3-VL text rotary without `mrope_section`.


def _moe_layer(cfg: ModelConfig) -> tuple:
  """Qwen3 attention and norms, the router, and the fused experts in transformers 5.24's form or the hub's."""
  E, M, X = cfg.hidden_size, int(cfg.require("moe_intermediate_size")), qwen3_moe.num_experts(cfg)
  experts = f"{common.LAYER}.mlp.experts"
  hub = common.fused_experts("moe_block", f"{experts}.gate_up_proj", f"{experts}.down_proj", experts=X, hidden=E,
                             expert_dim=M, interleaved=False)
  saved = tuple(
      Param(f"moe_block/wi_{k}", f"{experts}.gate_up_proj", (X, 2 * M, E),
            (ops.halves(k, 2, 2 * M, axis=0), ops.Transpose()), experts=X, experts_in_tensor=True)
      for k in range(2)
  ) + (Param("moe_block/wo", f"{experts}.down_proj", (X, E, M), (ops.Transpose(),), experts=X,
             experts_in_tensor=True),)
  router = Param("moe_block/gate/kernel", f"{common.LAYER}.mlp.gate.weight", (X, E), (ops.Transpose(),))
  return (common.layer_norms(cfg) + common.attention(cfg, common.WeightRules(), qk_norm=True)
          + (router, Alternatives((saved, hub))))


def _layout(cfg: ModelConfig, target: str, target_vocab: int, scan_layers: bool) -> Layout:
  if cfg.architecture == DENSE:
    layout = common.dense_decoder(cfg, common.WeightRules(), target_vocab, scan_layers, qk_norm=True)
  else:
    layout = Layout(common.embeddings(cfg, target_vocab),
                    standard_layer_groups(_moe_layer(cfg), cfg.num_layers, scan_layers))
  return layout.under(TEXT)


def mrope_section(cfg: ModelConfig) -> tuple[int, ...]:
  """The text rotary's (temporal, height, width) split of head_dim / 2 frequencies, interleaved on both sides."""
  section = tuple(int(s) for s in common.rope_parameters(cfg).get("mrope_section") or HF_DEFAULT_MROPE_SECTION)
  if len(section) != 3 or sum(section) != cfg.head_dim // 2:
    raise ConversionError(f"{cfg.path}: rope_parameters.mrope_section={list(section)} must split head_dim/2 ="
                          f" {cfg.head_dim // 2} frequencies in three (MaxText's multimodal rotary checks it)")
  return section


def _runtime(cfg: ModelConfig, target: str) -> Runtime:
  """The text decoder's keys; the tower's replace `deepstack_visual_indexes_for_vit` when it is converted."""
  if cfg.architecture == DENSE:
    text = qwen3.FAMILY.runtime(cfg, target)
  else:
    text = qwen3_moe.FAMILY.runtime(cfg, target).replace_config(norm_topk_prob=True)
  return text.replace_config(use_multimodal=False, use_mrope=True, mrope_section=mrope_section(cfg),
                             towers=(("deepstack_visual_indexes_for_vit", []),))


def _towers(cfg: ModelConfig, target: str) -> Towers:
  return qwen_vision.towers(cfg, prefix="model.visual", kind=qwen_vision.QWEN3_VL)


def _check(cfg: ModelConfig, target: str) -> list[str]:
  """Refuses a target whose decoder is not the checkpoint's (dense vs MoE), then what `checks` refuses."""
  dense = cfg.architecture == DENSE
  names = DENSE_TARGETS if dense else MOE_TARGETS
  if target not in names:
    raise ConversionError(f"--target_model={target}: a {cfg.architecture} checkpoint ({cfg.path}) runs as"
                          f" {' or '.join(names)} in MaxText 0.2.5 (the {'dense' if dense else 'MoE'} Qwen3-VL"
                          " decoder)")
  return checks(cfg, target)


def checks(cfg: ModelConfig, target: str) -> list[str]:
  """Whatever the model name: refuses dense layers among MoE ones and rope scaling or MRoPE layouts MaxText's
  multimodal rotary does not apply; warns about a sliding window."""
  if cfg.architecture != DENSE and (cfg.get("mlp_only_layers") or int(cfg.get("decoder_sparse_step") or 1) != 1):
    raise ConversionError(f"{cfg.path}: dense layers among MoE layers (mlp_only_layers={cfg.get('mlp_only_layers')},"
                          f" decoder_sparse_step={cfg.get('decoder_sparse_step')}) have no MaxText qwen3-vl"
                          " equivalent")
  rope = common.rope_parameters(cfg)
  if common.rope_kind(rope) != "default":
    raise ConversionError(f"{cfg.path}: rope_parameters={rope}: MaxText's multimodal rotary (use_mrope) applies no"
                          " rope scaling")
  if rope.get("mrope_interleaved") is False:
    raise ConversionError(f"{cfg.path}: rope_parameters.mrope_interleaved=false: MaxText interleaves the MRoPE"
                          " sections as Qwen3-VL does")
  mrope_section(cfg)
  return common.no_sliding_window(cfg, target)


FAMILY = Family(
    name="qwen3_vl",
    architectures=(DENSE, MOE),
    targets=("qwen3-vl",),
    infer_target=lambda cfg: "qwen3-vl-4b" if cfg.architecture == DENSE else "qwen3-vl-30b-a3b",
    runtime=_runtime,
    layout=_layout,
    check=_check,
    towers=_towers,
)
