"""Qwen3-MoE: Qwen3 attention, every layer a mixture of experts under `moe_block`."""

from converter.errors import ConversionError
from converter.families import common
from converter.families.base import DecoderSemantics, Family, Layout
from converter.model_config import ModelConfig


def num_experts(cfg: ModelConfig) -> int:
  """transformers 5 writes `num_local_experts`, earlier releases `num_experts`."""
  value = cfg.get("num_experts") or cfg.get("num_local_experts")
  if not value:
    raise ConversionError(f"{cfg.path}: missing 'num_experts' (or 'num_local_experts')")
  return int(value)


def _layout(cfg: ModelConfig, semantics: DecoderSemantics, target_vocab: int) -> Layout:
  if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
    raise ConversionError(
        f"{cfg.path}: dense layers among MoE layers (mlp_only_layers={cfg.get('mlp_only_layers')},"
        f" decoder_sparse_step={cfg.get('decoder_sparse_step')}) have no MaxText qwen3 MoE equivalent"
    )
  moe = common.moe_mlp(
      cfg, prefix="moe_block", router="mlp.gate", experts="mlp.experts", gate="gate_proj", up="up_proj",
      down="down_proj", num_experts=num_experts(cfg), expert_dim=cfg.require("moe_intermediate_size"),
  )
  return Layout(common.embeddings(cfg, target_vocab), common.layer_norms(cfg) + common.attention(cfg, semantics) + moe,
                cfg.num_layers)


def _check(cfg: ModelConfig, target: str) -> list[str]:
  warnings = common.no_sliding_window(cfg, target)
  if not cfg.get("norm_topk_prob", False):
    warnings.append(f"{cfg.path}: norm_topk_prob is false, but MaxText always renormalises the top-k router"
                    " weights: logits will differ from HF")
  return warnings


def _overrides(cfg: ModelConfig) -> dict:
  return {"num_experts": num_experts(cfg), "num_experts_per_tok": cfg.require("num_experts_per_tok"),
          "base_moe_mlp_dim": cfg.require("moe_intermediate_size"), "norm_topk_prob": bool(cfg.get("norm_topk_prob"))}


FAMILY = Family(
    name="qwen3_moe",
    architectures=("Qwen3MoeForCausalLM",),
    targets=("qwen3",),
    infer_target=common.single_target("qwen3"),
    semantics=lambda cfg, target: DecoderSemantics(qk_norm=True, moe=True),
    layout=_layout,
    check=_check,
    extra_overrides=_overrides,
)
