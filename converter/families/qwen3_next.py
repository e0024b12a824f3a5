"""Qwen3-Next (`qwen3-next-*`): cycles of gated-delta-net layers closed by one gated full-attention layer
(converter/families/hybrid.py), experts saved one by one, norms zero-centred (stored as-is: MaxText adds 1 at run
time, except the linear attention's gated norm, a plain scale).

HF already packs the linear attention per key head as MaxText does (`in_proj_qkvz`: [q, k, v, z] per key head;
`in_proj_ba`). Scanned, MaxText groups by block: `decoder/layers/local_layers` holds every block's linear layers
on two axes (block, layer in block), `decoder/layers/global_layer` the blocks' full-attention layers.
"""

from converter import ops
from converter.families import common, hybrid
from converter.families.base import ROTARY_CACHES, Family, LayerGroup, Layout, Param
from converter.model_config import ModelConfig


def _linear(cfg: ModelConfig, layer: str) -> tuple[Param, ...]:
  d = hybrid.gdn_dims(cfg)
  hf = f"{layer}.linear_attn"
  E, width = cfg.hidden_size, 2 * d["Hk"] * d["Dk"] + 2 * d["Hv"] * d["Dv"]
  return hybrid.linear_attention(
      cfg, layer,
      (Param("attention/in_proj_qkvz/kernel", f"{hf}.in_proj_qkvz.weight", (width, E), (ops.Transpose(),)),),
      (Param("attention/in_proj_ba/kernel", f"{hf}.in_proj_ba.weight", (2 * d["Hv"], E), (ops.Transpose(),)),))


def _layer(cfg: ModelConfig, i: int) -> tuple[Param, ...]:
  layer = common.LAYER
  attention = hybrid.full_attention(cfg, layer) if hybrid.is_full_attention(cfg, i) else _linear(cfg, layer)
  return attention + hybrid.moe(cfg, layer, hybrid.per_expert(cfg, layer))


def _layout(cfg: ModelConfig, target: str, target_vocab: int, scan_layers: bool) -> Layout:
  c, L = hybrid.cycle(cfg), cfg.num_layers
  if scan_layers:
    blocks = tuple(tuple(range(b, b + c - 1)) for b in range(0, L, c))
    groups = (LayerGroup(("decoder", "layers", "local_layers"), blocks, True, _layer(cfg, 0)),
              LayerGroup(("decoder", "layers", "global_layer"), tuple(range(c - 1, L, c)), True, _layer(cfg, c - 1)))
  else:
    groups = tuple(LayerGroup(("decoder", f"layers_{i}"), (i,), False, _layer(cfg, i)) for i in range(L))
  return Layout(common.embeddings(cfg, target_vocab), groups)


def _ignored(cfg: ModelConfig) -> dict[str, str]:
  return {**ROTARY_CACHES, r"mtp\.": "the multi-token-prediction module, which MaxText's model does not have"}


FAMILY = Family(
    name="qwen3_next",
    architectures=("Qwen3NextForCausalLM",),
    targets=("qwen3-next",),
    infer_target=common.single_target("qwen3-next"),
    runtime=lambda cfg, target: common.runtime(cfg, hybrid.DECODER, **hybrid.overrides(cfg)),
    layout=_layout,
    check=hybrid.checks,
    ignored_tensors=_ignored,
)
