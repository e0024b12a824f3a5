"""Gemma (v1): norms before attention and MLP stored as w + 1, gelu (tanh) MLP, query scale 1/sqrt(D) baked into the
kernel, tied embedding table pre-multiplied by sqrt(E) (MaxText divides the tied logits by sqrt(E) again).
"""

import math

from converter.families import common
from converter.families.base import Family, Layout, standard_layer_groups
from converter.families.runtime import Decoder
from converter.model_config import ModelConfig

DECODER = Decoder(query_scale=1.0, pre_attention_norm="pre_self_attention_norm", pre_mlp_norm="pre_ffw_norm",
                  layer_norm_epsilon=1e-6, mlp_activation="gelu_tanh")


def _layout(cfg: ModelConfig, target: str, target_vocab: int, scan_layers: bool) -> Layout:
  rules = common.gemma_rules(cfg, query_scale=1 / math.sqrt(cfg.head_dim))
  layer = common.sandwich_layer(cfg, rules, DECODER, qk_norm=False)
  return Layout(common.embeddings(cfg, target_vocab, rules), standard_layer_groups(layer, cfg.num_layers, scan_layers))


FAMILY = Family(
    name="gemma",
    architectures=("GemmaForCausalLM",),
    targets=("gemma",),
    infer_target=common.single_target("gemma"),
    runtime=lambda cfg, target: common.runtime(cfg, DECODER, normalize_embedding_logits=True),
    layout=_layout,
    check=lambda cfg, target: common.gemma_checks(cfg, target, "hidden_act") + common.no_rope_scaling(cfg, target),
)
