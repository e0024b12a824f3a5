"""Gemma 2: one MaxText layer holds two HF layers, 2i (sliding window, `*_local`) and 2i+1 (global, `*_global`);
norms before and after attention and MLP, stored as w + 1; query scale query_pre_attn_scalar**-0.5 baked into the
kernel (not 1/sqrt(head_dim): they differ for the 27B); attention and final logit soft caps; tied embedding table
pre-multiplied by sqrt(E).
"""

import math

from converter.families import common
from converter.families.base import Family, Layout, standard_layer_groups
from converter.families.runtime import Decoder, Runtime
from converter.model_config import ModelConfig

DECODER = Decoder(
    query_scale=1.0, pre_attention_norm="pre_self_attention_norm", pre_mlp_norm="pre_ffw_norm",
    post_attention_norm="post_self_attention_norm", post_mlp_norm="post_ffw_norm", layer_norm_epsilon=1e-6,
    mlp_activation="gelu_tanh", local_layers=(True, False), sublayer_suffixes=("_local", "_global"),
)


def _layout(cfg: ModelConfig, target: str, target_vocab: int, scan_layers: bool) -> Layout:
  rules = common.gemma_rules(cfg, query_scale=1.0 / math.sqrt(cfg.get("query_pre_attn_scalar", cfg.head_dim)))
  layer = common.sandwich_layer(cfg, rules, DECODER, qk_norm=False)
  num_layers = common.sublayered_num_layers(cfg, DECODER)
  return Layout(common.embeddings(cfg, target_vocab, rules), standard_layer_groups(layer, num_layers, scan_layers))


def _runtime(cfg: ModelConfig, target: str) -> Runtime:
  return common.runtime(
      cfg, DECODER, base_num_decoder_layers=common.sublayered_num_layers(cfg, DECODER),
      normalize_embedding_logits=True, sliding_window_size=cfg.require("sliding_window"),
      attn_logits_soft_cap=common.soft_cap(cfg.get("attn_logit_softcapping")),
      final_logits_soft_cap=common.soft_cap(cfg.get("final_logit_softcapping")))


def _check(cfg: ModelConfig, target: str) -> list[str]:
  common.sublayered_num_layers(cfg, DECODER)  # Refuses an odd number of layers.
  common.layer_pattern(cfg, DECODER, hf_pattern=2)
  return common.gemma_checks(cfg, target, "hidden_activation") + common.no_rope_scaling(cfg, target)


FAMILY = Family(
    name="gemma2",
    architectures=("Gemma2ForCausalLM",),
    targets=("gemma2",),
    infer_target=common.single_target("gemma2"),
    runtime=_runtime,
    layout=_layout,
    check=_check,
)
