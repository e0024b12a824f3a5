"""Qwen3-MoE: Qwen3 attention, every layer a mixture of experts under `moe_block`."""

from converter.errors import ConversionError
from converter.families import common
from converter.families.base import Family, Layout, standard_layer_groups
from converter.families.runtime import Decoder, Runtime
from converter.model_config import ModelConfig


def num_experts(cfg: ModelConfig) -> int:
  """transformers 5 writes `num_local_experts`, earlier releases `num_experts`."""
  value = cfg.get("num_experts") or cfg.get("num_local_experts")
  if not value:
    raise ConversionError(f"{cfg.path}: missing 'num_experts' (or 'num_local_experts')")
  return int(value)


def _layout(cfg: ModelConfig, target: str, target_vocab: int, scan_layers: bool) -> Layout:
  if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
    raise ConversionError(
        f"{cfg.path}: dense layers among MoE layers (mlp_only_layers={cfg.get('mlp_only_layers')},"
        f" decoder_sparse_step={cfg.get('decoder_sparse_step')}) have no MaxText qwen3 MoE equivalent"
    )
  moe = common.moe_mlp(
      cfg, prefix="moe_block", router="mlp.gate", experts="mlp.experts", gate="gate_proj", up="up_proj",
      down="down_proj", num_experts=num_experts(cfg), expert_dim=cfg.require("moe_intermediate_size"),
  )
  layer = common.layer_norms(cfg) + common.attention(cfg, common.WeightRules(), qk_norm=True) + moe
  return Layout(common.embeddings(cfg, target_vocab), standard_layer_groups(layer, cfg.num_layers, scan_layers))


def _runtime(cfg: ModelConfig, target: str) -> Runtime:
  return common.runtime(
      cfg, Decoder(qk_norm="rms", routing="softmax", moe_block="moe_block"), num_experts=num_experts(cfg),
      num_experts_per_tok=cfg.require("num_experts_per_tok"), base_moe_mlp_dim=cfg.require("moe_intermediate_size"),
      norm_topk_prob=bool(cfg.get("norm_topk_prob")))


FAMILY = Family(
    name="qwen3_moe",
    architectures=("Qwen3MoeForCausalLM",),
    targets=("qwen3",),
    infer_target=common.single_target("qwen3"),
    runtime=_runtime,
    layout=_layout,
    check=lambda cfg, target: common.no_sliding_window(cfg, target) + common.norm_topk_prob_ignored(cfg, target),
)
