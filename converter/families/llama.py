"""Llama 2, 3, 3.1/3.2/3.3: MaxText's llama2 decoder attends unscaled, so 1/sqrt(D) is baked into the query
kernel; only the llama3.1 rotary embedding (interleaved pairs, fixed llama3 scaling) needs the q/k permutation.
"""

import math

from converter.families import common
from converter.families.base import Family
from converter.families.runtime import Decoder
from converter.model_config import ModelConfig

def rope_scaling(cfg: ModelConfig) -> dict:
  scaling = common.rope_parameters(cfg)
  return scaling if common.rope_kind(scaling) == "llama3" else {}


def _infer_target(cfg: ModelConfig) -> str:
  if rope_scaling(cfg):
    return "llama3.1"
  return "llama3" if cfg.rope_theta >= 500000 else "llama2"


def _llama31(target: str) -> bool:
  return FAMILY.target_prefix(target) == "llama3.1"


def _check(cfg: ModelConfig, target: str) -> list[str]:
  scaling = rope_scaling(cfg)
  if scaling and not _llama31(target):
    return [f"{cfg.path}: llama3 rope scaling, which MaxText's {target} ignores (target llama3.1-* instead)"]
  return common.llama3_scaling_mismatch(cfg, scaling) if scaling else []


FAMILY = Family(
    name="llama",
    architectures=("LlamaForCausalLM",),
    targets=("llama2", "llama3", "llama3.1", "llama3.3"),
    infer_target=_infer_target,
    runtime=lambda cfg, target: common.runtime(
        cfg, Decoder(query_scale=1.0, rope="llama3.1" if _llama31(target) else "default"),
        rope_use_scale=bool(rope_scaling(cfg))),
    layout=lambda cfg, target, vocab, scan: common.dense_decoder(
        cfg, common.WeightRules(query_scale=1 / math.sqrt(cfg.head_dim), interleave_rope=_llama31(target)), vocab,
        scan),
    check=_check,
)
