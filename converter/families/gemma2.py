"""Gemma 2: one MaxText layer holds two HF layers, 2i (sliding window, `*_local`) and 2i+1 (global, `*_global`);
norms before and after attention and MLP, stored as w + 1; query scale query_pre_attn_scalar**-0.5 baked into the
kernel (not 1/sqrt(head_dim): they differ for the 27B); attention and final logit soft caps; tied embedding table
pre-multiplied by sqrt(E).
"""

import math

from converter.families import common
from converter.families.base import DecoderSemantics, Family
from converter.model_config import ModelConfig

SUBLAYERS = ("_local", "_global")


def semantics(cfg: ModelConfig, target: str) -> DecoderSemantics:
  return DecoderSemantics(
      query_scale_in_kernel=True, pre_attention_norm="pre_self_attention_norm", pre_mlp_norm="pre_ffw_norm",
      post_attention_norm="post_self_attention_norm", post_mlp_norm="post_ffw_norm", norm_scale_offset=1.0,
      layer_norm_epsilon=1e-6, mlp_activation="gelu_tanh",
      query_scale=1.0 / math.sqrt(cfg.get("query_pre_attn_scalar", cfg.head_dim)),
      attn_logits_soft_cap=cfg.get("attn_logit_softcapping"), sliding_window=cfg.require("sliding_window"),
      local_layers=(True, False), embedding_scale=math.sqrt(cfg.hidden_size), normalize_embedding_logits=True,
      final_logits_soft_cap=cfg.get("final_logit_softcapping"), sublayer_suffixes=SUBLAYERS,
  )


def _check(cfg: ModelConfig, target: str) -> list[str]:
  common.sublayered_num_layers(cfg, semantics(cfg, target))  # Refuses an odd number of layers.
  common.layer_pattern(cfg, semantics(cfg, target), hf_pattern=2)
  return common.gemma_checks(cfg, target, "hidden_activation") + common.no_rope_scaling(cfg, target)


def _overrides(cfg: ModelConfig) -> dict:
  return {
      "base_num_decoder_layers": common.sublayered_num_layers(cfg, semantics(cfg, "gemma2")),
      "normalize_embedding_logits": True,
      "sliding_window_size": cfg.require("sliding_window"),
      "attn_logits_soft_cap": common.soft_cap(cfg.get("attn_logit_softcapping")),
      "final_logits_soft_cap": common.soft_cap(cfg.get("final_logit_softcapping")),
  }


FAMILY = Family(
    name="gemma2",
    architectures=("Gemma2ForCausalLM",),
    targets=("gemma2",),
    infer_target=common.single_target("gemma2"),
    semantics=semantics,
    layout=common.sandwich_decoder,
    check=_check,
    extra_overrides=_overrides,
)
