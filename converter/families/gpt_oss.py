"""GPT-OSS 20b / 120b (`gpt-oss-*`): attention with biases and per-head sinks, sliding-window and full layers in
turn, YaRN; experts fused in HF tensors that already hold every expert, gate and up interleaved (even and odd
columns), with biases and a clamped SwiGLU. Scanned, MaxText stacks layers in two strided blocks
(`decoder/layers/layers_{b}` holds HF layers b, b + 2, ...). The MXFP4 experts of the openai/gpt-oss-* repos are
read through the mxfp4 source.
"""

from converter import ops
from converter.errors import ConversionError
from converter.families import common
from converter.families.base import Family, Layout, Param
from converter.families.runtime import Decoder
from converter.model_config import ModelConfig

CYCLE = 2  # MaxText's GPT_OSS_ATTENTION_PATTERN: layers_0 sliding window, layers_1 global.
SWIGLU_ALPHA = 1.702  # Hard-coded in MaxText's MoE.
DECODER = Decoder(attention_block="GptOssAttention", attention_sinks=True, rope="yarn", routing="gpt_oss",
                  moe_block="GptOssMlp", local_layers=(True, False))


def _layer(cfg: ModelConfig) -> tuple[Param, ...]:
  E, X, M = cfg.hidden_size, int(cfg.require("num_local_experts")), cfg.intermediate_size
  attention = common.attention(cfg, common.WeightRules(), prefix="GptOssAttention", bias=True, out_bias=True) + (
      Param("GptOssAttention/sinks", f"{common.LAYER}.self_attn.sinks", (cfg.num_heads,)),)
  experts = f"{common.LAYER}.mlp.experts"
  mlp = (
      Param("GptOssMlp/gate/kernel", f"{common.LAYER}.mlp.router.weight", (X, E), (ops.Transpose(),)),
      Param("GptOssMlp/gate/bias", f"{common.LAYER}.mlp.router.bias", (X,)),
      *common.fused_experts("GptOssMlp", f"{experts}.gate_up_proj", f"{experts}.down_proj", experts=X, hidden=E,
                            expert_dim=M, interleaved=True),
      Param("GptOssMlp/wi_0_bias", f"{experts}.gate_up_proj_bias", (X, 2 * M), (ops.interleaved(0, 2, 2 * M),), experts=X,
            experts_in_tensor=True),
      Param("GptOssMlp/wi_1_bias", f"{experts}.gate_up_proj_bias", (X, 2 * M), (ops.interleaved(1, 2, 2 * M),), experts=X,
            experts_in_tensor=True),
      Param("GptOssMlp/wo_bias", f"{experts}.down_proj_bias", (X, E), experts=X, experts_in_tensor=True),
  )
  return common.layer_norms(cfg) + attention + mlp


def _layout(cfg: ModelConfig, target: str, target_vocab: int, scan_layers: bool) -> Layout:
  layer = _layer(cfg)
  return Layout(common.embeddings(cfg, target_vocab),
                common.strided_block_groups(lambda i: layer, cycle=CYCLE, num_layers=cfg.num_layers,
                                            scan_layers=scan_layers, config_path=cfg.path))


def _overrides(cfg: ModelConfig, warnings: list[str]) -> dict:
  return dict(
      base_moe_mlp_dim=cfg.intermediate_size, num_experts=int(cfg.require("num_local_experts")),
      num_experts_per_tok=int(cfg.require("num_experts_per_tok")),
      sliding_window_size=int(cfg.require("sliding_window")),
      attention_bias=True, rope_interleave=False, mlp_activations_limit=float(cfg.get("swiglu_limit") or 7.0),
      inhomogeneous_layer_cycle_interval=CYCLE, **common.yarn_rope(cfg, warnings, latent_attention=False),
  )


def _check(cfg: ModelConfig, target: str) -> list[str]:
  expected = ["sliding_attention" if DECODER.is_local(i) else "full_attention" for i in range(cfg.num_layers)]
  layer_types = cfg.get("layer_types")
  if layer_types and list(layer_types) != expected:
    raise ConversionError(f"{cfg.path}: layer_types {layer_types} is not sliding and full attention in turn, the"
                          " pattern MaxText's gpt_oss decoder hard-codes")
  warnings: list[str] = []
  _overrides(cfg, warnings)
  alpha = float(cfg.get("swiglu_alpha") or SWIGLU_ALPHA)
  if alpha != SWIGLU_ALPHA:
    warnings.append(f"{cfg.path}: swiglu_alpha={alpha}; MaxText's gpt_oss MLP hard-codes {SWIGLU_ALPHA}")
  return warnings


FAMILY = Family(
    name="gpt_oss",
    architectures=("GptOssForCausalLM",),
    targets=("gpt-oss",),
    infer_target=common.single_target("gpt-oss"),
    runtime=lambda cfg, target: common.runtime(cfg, DECODER, **_overrides(cfg, [])),
    layout=_layout,
    check=_check,
)
