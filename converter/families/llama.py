"""Llama 2, 3, 3.1/3.2/3.3: MaxText's llama2 decoder bakes 1/sqrt(D) into the query kernel; only the llama3.1
rotary embedding (interleaved pairs, fixed llama3 scaling) needs the q/k permutation.
"""

from converter.families import common
from converter.families.base import DecoderSemantics, Family
from converter.model_config import ModelConfig

# The llama3 rope scaling MaxText 0.2.5 hard-codes for llama3.1 targets.
MAXTEXT_LLAMA3_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 8192}


def rope_scaling(cfg: ModelConfig) -> dict:
  """HF keeps it in `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5)."""
  scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
  return scaling if scaling.get("rope_type", scaling.get("type")) == "llama3" else {}


def _infer_target(cfg: ModelConfig) -> str:
  if rope_scaling(cfg):
    return "llama3.1"
  return "llama3" if cfg.rope_theta >= 500000 else "llama2"


def _semantics(cfg: ModelConfig, target: str) -> DecoderSemantics:
  llama31 = FAMILY.target_prefix(target) == "llama3.1"
  return DecoderSemantics(query_scale_in_kernel=True, rope_interleaved=llama31, llama3_rope_scaling=llama31)


def _check(cfg: ModelConfig, target: str) -> list[str]:
  scaling = rope_scaling(cfg)
  llama31 = FAMILY.target_prefix(target) == "llama3.1"
  if llama31 and not scaling:
    return [f"{cfg.path}: no llama3 rope scaling, but MaxText's {target} rotary embedding applies it:"
            " long-context logits will differ from HF (target llama3 instead)"]
  if scaling and not llama31:
    return [f"{cfg.path}: llama3 rope scaling, which MaxText's {target} ignores (target llama3.1-* instead)"]
  if scaling:
    differing = {k: (scaling.get(k), v) for k, v in MAXTEXT_LLAMA3_SCALING.items() if float(scaling.get(k, -1)) != v}
    if differing:
      return [f"{cfg.path}: rope scaling {differing} (HF, MaxText): MaxText 0.2.5 hard-codes factor 8, low 1,"
              " high 4, original context 8192, so this checkpoint's logits cannot be reproduced exactly"]
  return []


FAMILY = Family(
    name="llama",
    architectures=("LlamaForCausalLM",),
    targets=("llama2", "llama3", "llama3.1", "llama3.3"),
    infer_target=_infer_target,
    semantics=_semantics,
    layout=common.dense_decoder,
    check=_check,
    extra_overrides=lambda cfg: {"rope_use_scale": bool(rope_scaling(cfg))},
)
