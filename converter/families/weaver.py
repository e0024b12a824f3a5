"""Weaver (`WeaverOmniForConditionalGeneration`, and `WeaverForConditionalGeneration` as MaxText spells weaver-max's)
-> MaxText `weaver-mini` / `weaver-max`: dense Qwen3-VL under Weaver's tensor names.

MaxText 0.2.5 builds both names from Qwen3-VL's classes (decoder_block qwen3, vision_encoder_block qwen3_vl with
deepstack mergers; multimodal/processor.py maps them to ("qwen3_vl", "qwen3")), and its converter reads them as
Qwen3-VL with every HF name rewritten (checkpoint_conversion/utils/param_mapping.py,
WEAVER_MAXTEXT_TO_HF_PARAM_MAPPING's `translate_hf_key`): the `model.language_model.` / `model.visual.` / `model.`
prefix dropped (`layers.0...`, `embed_tokens.weight`, `norm.weight`, `blocks.0...`, `merger...`; `lm_head.weight`
unchanged), and the text attention's projections and q/k norms renamed (`self_attn.to_q/to_k/to_v/to_out`,
`self_attn.norm_q/norm_k`). Its hooks are Qwen3-VL's. So this family is qwen3_vl's dense layout, runtime, tower and
checks under those names; config.json nests the dims as Qwen3-VL's does (`text_config`, `vision_config`).

MaxText's models/weaver.py (a dual-pathway Mixture-of-Transformers) is not what these model names build.
"""

from __future__ import annotations

import dataclasses
import re

from converter.errors import ConversionError
from converter.families import qwen3_vl
from converter.families.base import Family, Layout, Towers
from converter.families.runtime import Runtime
from converter.model_config import ModelConfig

MINI = "WeaverOmniForConditionalGeneration"
MAX = "WeaverForConditionalGeneration"
TARGETS = ("weaver-mini", "weaver-max")
_ATTENTION = {"q_proj": "to_q", "k_proj": "to_k", "v_proj": "to_v", "o_proj": "to_out", "q_norm": "norm_q",
              "k_norm": "norm_k"}
# The tower's tensors once `model.visual.` is dropped: what a text-only conversion skips.
_TOWER = r"(patch_embed|pos_embed|blocks|merger|deepstack_merger_list)\."


def hf_name(qwen3_vl_name: str) -> str:
  """Qwen3-VL's name of a tensor -> Weaver's, as MaxText's `translate_hf_key` rewrites it."""
  name = re.sub(r"^model\.(language_model\.|visual\.)?", "", qwen3_vl_name)
  return re.sub(r"\.self_attn\.([qkvo]_proj|[qk]_norm)\.", lambda m: f".self_attn.{_ATTENTION[m[1]]}.", name)


def _as_qwen3_vl(cfg: ModelConfig) -> ModelConfig:
  return dataclasses.replace(cfg, architecture=qwen3_vl.DENSE)


def _layout(cfg: ModelConfig, target: str, target_vocab: int, scan_layers: bool) -> Layout:
  return qwen3_vl.FAMILY.layout(_as_qwen3_vl(cfg), target, target_vocab, scan_layers).renamed(hf_name)


def _runtime(cfg: ModelConfig, target: str) -> Runtime:
  return qwen3_vl.FAMILY.runtime(_as_qwen3_vl(cfg), target)


def _towers(cfg: ModelConfig, target: str) -> Towers:
  return qwen3_vl.FAMILY.towers(_as_qwen3_vl(cfg), target).renamed(
      hf_name, {_TOWER: "the vision tower and its patch mergers"})


def _check(cfg: ModelConfig, target: str) -> list[str]:
  """Refuses a name MaxText has no Weaver of and a MoE decoder (both Weaver ymls are dense), then Qwen3-VL's checks."""
  if target not in TARGETS:
    raise ConversionError(f"--target_model={target}: MaxText 0.2.5's Weaver models are {' and '.join(TARGETS)}")
  if cfg.get("num_experts") or cfg.get("num_local_experts"):
    raise ConversionError(f"{cfg.path}: a mixture-of-experts Weaver decoder: MaxText 0.2.5's {' and '.join(TARGETS)}"
                          " are dense (decoder_block qwen3)")
  return qwen3_vl.checks(_as_qwen3_vl(cfg), target)


FAMILY = Family(
    name="weaver",
    architectures=(MINI, MAX),
    targets=("weaver",),
    infer_target=lambda cfg: "weaver-max" if cfg.architecture == MAX else "weaver-mini",
    runtime=_runtime,
    layout=_layout,
    check=_check,
    towers=_towers,
)
