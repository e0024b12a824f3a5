"""Gemma (v1): norms before attention and MLP stored as w + 1, gelu (tanh) MLP, query scale 1/sqrt(D) baked into the
kernel, tied embedding table pre-multiplied by sqrt(E) (MaxText divides the tied logits by sqrt(E) again).
"""

import math

from converter.families import common
from converter.families.base import DecoderSemantics, Family
from converter.model_config import ModelConfig


def semantics(cfg: ModelConfig, target: str) -> DecoderSemantics:
  return DecoderSemantics(
      query_scale_in_kernel=True, pre_attention_norm="pre_self_attention_norm", pre_mlp_norm="pre_ffw_norm",
      norm_scale_offset=1.0, layer_norm_epsilon=1e-6, mlp_activation="gelu_tanh",
      embedding_scale=math.sqrt(cfg.hidden_size), normalize_embedding_logits=True,
  )


FAMILY = Family(
    name="gemma",
    architectures=("GemmaForCausalLM",),
    targets=("gemma",),
    infer_target=common.single_target("gemma"),
    semantics=semantics,
    layout=common.sandwich_decoder,
    check=lambda cfg, target: common.gemma_checks(cfg, target, "hidden_act") + common.no_rope_scaling(cfg, target),
    extra_overrides=lambda cfg: {"normalize_embedding_logits": True},
)
