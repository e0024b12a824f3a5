"""Mixtral: Mistral attention (query scale baked in), experts under `MoeBlock_0`, HF names w1/w3/w2."""

from converter.families import common
from converter.families.base import DecoderSemantics, Family, Layout
from converter.model_config import ModelConfig


def _layout(cfg: ModelConfig, semantics: DecoderSemantics, target_vocab: int) -> Layout:
  moe = common.moe_mlp(
      cfg, prefix="MoeBlock_0", router="block_sparse_moe.gate", experts="block_sparse_moe.experts", gate="w1",
      up="w3", down="w2", num_experts=int(cfg.require("num_local_experts")), expert_dim=cfg.intermediate_size,
  )
  return Layout(common.embeddings(cfg, target_vocab), common.layer_norms(cfg) + common.attention(cfg, semantics) + moe,
                cfg.num_layers)


def _overrides(cfg: ModelConfig) -> dict:
  return {"num_experts": cfg.require("num_local_experts"), "num_experts_per_tok": cfg.require("num_experts_per_tok"),
          "base_moe_mlp_dim": cfg.intermediate_size}


FAMILY = Family(
    name="mixtral",
    architectures=("MixtralForCausalLM",),
    targets=("mixtral",),
    infer_target=common.single_target("mixtral"),
    semantics=lambda cfg, target: DecoderSemantics(query_scale_in_kernel=True, moe=True, moe_block="MoeBlock_0"),
    layout=_layout,
    check=common.no_sliding_window,
    extra_overrides=_overrides,
)
