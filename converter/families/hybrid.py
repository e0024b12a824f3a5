"""Pieces of the hybrid Qwen decoders (Qwen3-Next, Qwen3.5): cycles of gated-delta-net linear-attention layers
closed by one gated full-attention layer, every layer a mixture of experts with a gated shared expert.

Both families store MaxText's leaves under the same names (`attention/in_proj_qkvz`, `attention/attention/query`,
`mlp/routed_experts`, ...); they differ in how HF packs the linear-attention projections and in how a scanned
checkpoint groups the layers, which their own files say.
"""

from __future__ import annotations

from typing import Any

from converter import ops
from converter.errors import ConversionError
from converter.families import common
from converter.families.base import Param
from converter.families.runtime import Decoder
from converter.model_config import ModelConfig

DECODER = Decoder(rope="default", norm_offset=1.0, routing="softmax", moe_block="mlp", forward="qwen3_next")


def gdn_dims(cfg: ModelConfig) -> dict[str, int]:
  """Linear attention's heads: Hk key heads of Dk, Hv value heads of Dv (r = Hv / Hk per key head), conv K."""
  d = dict(Hk=int(cfg.require("linear_num_key_heads")), Hv=int(cfg.require("linear_num_value_heads")),
           Dk=int(cfg.require("linear_key_head_dim")), Dv=int(cfg.require("linear_value_head_dim")),
           K=int(cfg.require("linear_conv_kernel_dim")))
  if d["Hv"] % d["Hk"]:
    raise ConversionError(f"{cfg.path}: linear_num_value_heads={d['Hv']} is not a multiple of linear_num_key_heads="
                          f"{d['Hk']}")
  d["r"] = d["Hv"] // d["Hk"]
  d["C"] = 2 * d["Hk"] * d["Dk"] + d["Hv"] * d["Dv"]  # Conv channels: q, k and v of every head.
  return d


def cycle(cfg: ModelConfig) -> int:
  """Layers per cycle: `full_attention_interval` (hub configs), else the distance between full-attention layers."""
  interval = cfg.get("full_attention_interval")
  if interval:
    return int(interval)
  layer_types = cfg.get("layer_types") or []
  if "full_attention" in layer_types:
    return layer_types.index("full_attention") + 1
  return 4


def is_full_attention(cfg: ModelConfig, layer: int) -> bool:
  return layer % cycle(cfg) == cycle(cfg) - 1


def linear_attention(cfg: ModelConfig, layer: str, qkvz: tuple[Param, ...], ba: tuple[Param, ...]) -> tuple[Param, ...]:
  """The gated delta net: the family's packed projections, then what both families store alike."""
  d = gdn_dims(cfg)
  hf = f"{layer}.linear_attn"
  return qkvz + ba + (
      Param("attention/conv1d/kernel", f"{hf}.conv1d.weight", (d["C"], 1, d["K"]), (ops.Transpose(),)),
      Param("attention/A_log", f"{hf}.A_log", (d["Hv"],)),
      Param("attention/dt_bias", f"{hf}.dt_bias", (d["Hv"],)),
      Param("attention/norm/rms_norm/scale", f"{hf}.norm.weight", (d["Dv"],)),
      Param("attention/out_proj/kernel", f"{hf}.out_proj.weight", (cfg.hidden_size, d["Hv"] * d["Dv"]),
            (ops.Transpose(),)),
  )


def full_attention(cfg: ModelConfig, layer: str) -> tuple[Param, ...]:
  """Gated attention: q_proj packs each head's query and output gate ((E, H, 2D) in MaxText), a 2-D out kernel."""
  E, H, KV, D = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  hf, p = f"{layer}.self_attn", "attention/attention"
  return (
      Param(f"{p}/query/kernel", f"{hf}.q_proj.weight", (2 * H * D, E), ops.to_heads_kernel(E, H, 2 * D)),
      Param(f"{p}/key/kernel", f"{hf}.k_proj.weight", (KV * D, E), ops.to_heads_kernel(E, KV, D)),
      Param(f"{p}/value/kernel", f"{hf}.v_proj.weight", (KV * D, E), ops.to_heads_kernel(E, KV, D)),
      Param(f"{p}/out/kernel", f"{hf}.o_proj.weight", (E, H * D), (ops.Transpose(),)),
      Param(f"{p}/query_norm/scale", f"{hf}.q_norm.weight", (D,)),
      Param(f"{p}/key_norm/scale", f"{hf}.k_norm.weight", (D,)),
  )


def moe(cfg: ModelConfig, layer: str, routed: tuple[Param, ...]) -> tuple[Param, ...]:
  """Routed experts (the family's stored form), the shared expert and its sigmoid gate; the layer's norms."""
  E, M = cfg.hidden_size, int(cfg.require("moe_intermediate_size"))
  return routed + common.dense_mlp(cfg, "mlp/shared_expert", f"{layer}.mlp.shared_expert", M) + (
      Param("mlp/shared_expert_gate/kernel", f"{layer}.mlp.shared_expert_gate.weight", (1, E), (ops.Transpose(),)),
      Param("input_layernorm/scale", f"{layer}.input_layernorm.weight", (E,)),
      Param("post_attention_layernorm/scale", f"{layer}.post_attention_layernorm.weight", (E,)),
  )


def per_expert(cfg: ModelConfig, layer: str) -> tuple[Param, ...]:
  """Routed experts saved one by one (`mlp.experts.{e}.*_proj.weight`)."""
  return common.moe_mlp(cfg, prefix="mlp/routed_experts", router="mlp.gate", experts="mlp.experts", gate="gate_proj",
                        up="up_proj", down="down_proj", num_experts=num_experts(cfg),
                        expert_dim=int(cfg.require("moe_intermediate_size")), layer=layer)


def num_experts(cfg: ModelConfig) -> int:
  return int(cfg.get("num_experts") or cfg.require("num_local_experts"))


def partial_rotary_factor(cfg: ModelConfig) -> float:
  return float(common.rope_parameters(cfg).get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or 1.0)


def overrides(cfg: ModelConfig) -> dict[str, Any]:
  d = gdn_dims(cfg)
  return dict(
      base_moe_mlp_dim=int(cfg.require("moe_intermediate_size")), num_experts=num_experts(cfg),
      num_experts_per_tok=int(cfg.require("num_experts_per_tok")),
      norm_topk_prob=bool(cfg.get("norm_topk_prob", True)), shared_experts=1,
      gdn_conv_kernel_dim=d["K"], gdn_key_head_dim=d["Dk"], gdn_value_head_dim=d["Dv"], gdn_num_key_heads=d["Hk"],
      gdn_num_value_heads=d["Hv"], inhomogeneous_layer_cycle_interval=cycle(cfg),
      partial_rotary_factor=partial_rotary_factor(cfg),
  )


def checks(cfg: ModelConfig, target: str) -> list[str]:
  """What MaxText's hybrid decoders hard-code: full attention closing each cycle, MoE everywhere, a shared expert
  as wide as the routed ones, renormalised top-k weights."""
  c = cycle(cfg)
  expected = ["full_attention" if is_full_attention(cfg, i) else "linear_attention" for i in range(cfg.num_layers)]
  if cfg.get("layer_types") and list(cfg.get("layer_types")) != expected:
    raise ConversionError(f"{cfg.path}: layer_types {cfg.get('layer_types')} is not {c - 1} linear-attention layers"
                          f" then one full-attention layer, the cycle MaxText's {target} hard-codes")
  if cfg.num_layers % c:
    raise ConversionError(f"{cfg.path}: num_hidden_layers={cfg.num_layers} is not a multiple of the cycle {c}:"
                          f" MaxText's {target} needs whole cycles")
  if cfg.get("mlp_only_layers") or int(cfg.get("decoder_sparse_step") or 1) != 1:
    raise ConversionError(f"{cfg.path}: dense layers (mlp_only_layers={cfg.get('mlp_only_layers')},"
                          f" decoder_sparse_step={cfg.get('decoder_sparse_step')}); MaxText's {target} has MoE in"
                          " every layer")
  shared = cfg.get("shared_expert_intermediate_size")
  if shared is not None and int(shared) != int(cfg.require("moe_intermediate_size")):
    raise ConversionError(f"{cfg.path}: shared_expert_intermediate_size={shared} differs from moe_intermediate_size="
                          f"{cfg.get('moe_intermediate_size')}; MaxText's shared expert is as wide as the routed ones")
  if common.rope_kind(common.rope_parameters(cfg)) != "default":
    raise ConversionError(f"{cfg.path}: rope scaling {common.rope_parameters(cfg)}; MaxText's {target} has plain rope")
  gdn_dims(cfg)
  return common.norm_topk_prob_ignored(cfg, target)
