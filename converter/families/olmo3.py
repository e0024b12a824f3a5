"""OLMo 3 (`olmo3-*`): no norms before attention and MLP, one norm on each output (`post_self_attention_layer_norm`,
`post_mlp_layer_norm`); query and key norms over all heads at once ((H*D,), MaxText's GlobalRMSNorm); three
sliding-window layers then one full-attention layer; query scale at run time. Scanned, MaxText stacks layers in
four strided blocks (`decoder/layers/layers_{k}` holds HF layers k, k + 4, ...; k = 3 is the full-attention one).

MaxText applies the configured rope (YaRN for olmo3-7b and olmo3-32b) to every layer, transformers 5.24 to the
full-attention layers only: a YaRN checkpoint converts with one warning that logits will differ.
"""

import dataclasses

from converter.errors import ConversionError
from converter.families import common
from converter.families.base import Family, Layout, Param
from converter.families.runtime import Decoder, Runtime
from converter.model_config import ModelConfig

CYCLE = 4  # MaxText's OLMO3_ATTENTION_PATTERN: layers 0-2 sliding window, layer 3 global.
DECODER = Decoder(attention_block="attention", qk_norm="global", pre_attention_norm="", pre_mlp_norm="",
                  post_attention_norm="post_self_attention_layer_norm", post_mlp_norm="post_mlp_layer_norm",
                  local_layers=(True, True, True, False))


def _rope(cfg: ModelConfig) -> dict:
  """The full-attention layers' rope scaling (transformers 5 nests it per layer type; hub configs are flat)."""
  params = common.rope_parameters(cfg)
  return dict(params.get("full_attention") or {}) if "full_attention" in params else params


def _layer(cfg: ModelConfig) -> tuple[Param, ...]:
  E, H, KV, D = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  attention = common.attention(cfg, common.WeightRules(), prefix="attention") + (
      Param("attention/query_norm/scale", f"{common.LAYER}.self_attn.q_norm.weight", (H * D,)),
      Param("attention/key_norm/scale", f"{common.LAYER}.self_attn.k_norm.weight", (KV * D,)),
  )
  norms = (
      Param("post_self_attention_layer_norm/scale", f"{common.LAYER}.post_attention_layernorm.weight", (E,)),
      Param("post_mlp_layer_norm/scale", f"{common.LAYER}.post_feedforward_layernorm.weight", (E,)),
  )
  return attention + common.dense_mlp(cfg) + norms


def _layout(cfg: ModelConfig, target: str, target_vocab: int, scan_layers: bool) -> Layout:
  layer = _layer(cfg)
  return Layout(common.embeddings(cfg, target_vocab),
                common.strided_block_groups(lambda i: layer, cycle=CYCLE, num_layers=cfg.num_layers,
                                            scan_layers=scan_layers, config_path=cfg.path))


def _runtime(cfg: ModelConfig, target: str) -> Runtime:
  yarn = common.rope_kind(_rope(cfg)) == "yarn"
  rope = {"rope_type": "default"}
  if yarn:
    rope = {"rope_type": "yarn", **common.yarn_rope(cfg, [], latent_attention=False, scaling=_rope(cfg))}
  return common.runtime(
      cfg, dataclasses.replace(DECODER, rope="yarn" if yarn else "default"), use_qk_norm=True,
      sliding_window_size=int(cfg.require("sliding_window")), inhomogeneous_layer_cycle_interval=CYCLE,
      rope_interleave=False, **rope)


def _check(cfg: ModelConfig, target: str) -> list[str]:
  expected = ["sliding_attention" if DECODER.is_local(i) else "full_attention" for i in range(cfg.num_layers)]
  if cfg.get("layer_types") and list(cfg.get("layer_types")) != expected:
    raise ConversionError(f"{cfg.path}: layer_types {cfg.get('layer_types')} is not three sliding-window layers then"
                          f" one full-attention layer, the pattern MaxText's {target} hard-codes")
  kind = common.rope_kind(_rope(cfg))
  if kind not in ("default", "yarn"):
    raise ConversionError(f"{cfg.path}: rope scaling {_rope(cfg)}; MaxText's {target} has plain rope or YaRN")
  if kind == "yarn":
    return [f"{cfg.path}: YaRN rope scaling on the full-attention layers; MaxText's {target} applies it to every"
            " layer, sliding-window ones included (transformers 5.24 does not), so logits will differ from HF"]
  return []


FAMILY = Family(
    name="olmo3",
    architectures=("Olmo3ForCausalLM",),
    targets=("olmo3",),
    infer_target=lambda cfg: "olmo3-7b" if common.rope_kind(_rope(cfg)) == "yarn" else "olmo3-7b-pt",
    runtime=_runtime,
    layout=_layout,
    check=_check,
)
