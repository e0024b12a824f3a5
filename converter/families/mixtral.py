"""Mixtral: Mistral attention (query scale baked in), experts under `MoeBlock_0`, HF names w1/w3/w2."""

import math

from converter.families import common
from converter.families.base import Family, Layout, standard_layer_groups
from converter.families.runtime import Decoder, Runtime
from converter.model_config import ModelConfig


def _layout(cfg: ModelConfig, target: str, target_vocab: int, scan_layers: bool) -> Layout:
  moe = common.moe_mlp(
      cfg, prefix="MoeBlock_0", router="block_sparse_moe.gate", experts="block_sparse_moe.experts", gate="w1",
      up="w3", down="w2", num_experts=int(cfg.require("num_local_experts")), expert_dim=cfg.intermediate_size,
  )
  rules = common.WeightRules(query_scale=1 / math.sqrt(cfg.head_dim))
  layer = common.layer_norms(cfg) + common.attention(cfg, rules) + moe
  return Layout(common.embeddings(cfg, target_vocab), standard_layer_groups(layer, cfg.num_layers, scan_layers))


def _runtime(cfg: ModelConfig, target: str) -> Runtime:
  return common.runtime(
      cfg, Decoder(query_scale=1.0, routing="softmax", moe_block="MoeBlock_0"),
      num_experts=cfg.require("num_local_experts"), num_experts_per_tok=cfg.require("num_experts_per_tok"),
      base_moe_mlp_dim=cfg.intermediate_size)


FAMILY = Family(
    name="mixtral",
    architectures=("MixtralForCausalLM",),
    targets=("mixtral",),
    infer_target=common.single_target("mixtral"),
    runtime=_runtime,
    layout=_layout,
    check=common.no_sliding_window,
)
