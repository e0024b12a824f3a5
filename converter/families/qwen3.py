"""Qwen3 dense: Llama-style decoder with per-head RMSNorm on queries and keys, query scale at run time."""

from converter.families import common
from converter.families.base import DecoderSemantics, Family, Layout


def _semantics(cfg, target):
  del cfg, target
  return DecoderSemantics(qk_norm=True)


def _layout(cfg, semantics, target_vocab):
  return Layout(
      top=common.embeddings(cfg, target_vocab),
      layer=common.layer_norms(cfg) + common.attention(cfg, semantics) + common.dense_mlp(cfg),
      num_layers=cfg.num_layers,
  )


FAMILY = Family(
    name="qwen3",
    architectures=("Qwen3ForCausalLM",),
    default_target="qwen3",
    semantics=_semantics,
    layout=_layout,
)
