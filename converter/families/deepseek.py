"""DeepSeek V2 / V2-Lite (`deepseek2-*`), V3 / R1 / V3.1 and Kimi K2 (`deepseek3-*`, `kimi-k2-*`), V3.2 with its
sparse indexer (`deepseek3.2-*`): multi-head latent attention, routed plus shared experts.

MaxText keeps the first `first_k_dense_replace` layers under `decoder/dense_layers` and the rest under
`decoder/moe_layers`, each group numbered from 0 when unscanned. The model name picks the routing: deepseek3*,
kimi-k2* get sigmoid scores, the `e_score_correction_bias` for the choice (its leaf has the layer axis first when
scanned, as MaxText's MoEBiasVar) and routing groups; deepseek2* a plain top-k of the softmax. No query scale is
baked in and the rotary columns are already interleaved. The multi-token-prediction layer(s) after the last
decoder layer are not part of MaxText's model and are skipped. FP8 checkpoints are read through the fp8 source,
Kimi K2-Thinking's INT4 experts through the compressed-tensors one; Kimi K2.5 / K2.6 wrap the same text model
(kimi_k25.py).
"""

from converter import ops
from converter.errors import ConversionError
from converter.families import common
from converter.families.base import ROTARY_CACHES, Family, LayerGroup, Layout, Param
from converter.families.runtime import Decoder, Runtime
from converter.model_config import ModelConfig

ATTN = f"{common.LAYER}.self_attn"
MOE = "DeepSeekMoeBlock_0"
DECODER = Decoder(attention="mla", rope="yarn", routing="deepseek", moe_block=MOE)
ROUTED_BY_GROUPS = ("deepseek3", "deepseek3.2", "kimi-k2")  # MaxText's deepseek_routing and MoEBiasVar.
KIMI_MODEL = "kimi-k2-1t"  # MaxText 0.2.5's one Kimi model name (configs/types.py).
# The epsilon of the low-rank query and key-value norms (q_a_layernorm, kv_a_layernorm) in transformers' and the
# checkpoints' own modelling code, whatever rms_norm_eps says; MaxText uses normalization_layer_epsilon for them.
LATENT_NORM_EPS = 1e-6


def _version(cfg: ModelConfig) -> str:
  """"v2", "v3" or "v3.2", from the architecture."""
  return {"DeepseekV2ForCausalLM": "v2", "DeepseekV32ForCausalLM": "v3.2"}.get(cfg.architecture, "v3")


def _infer_target(cfg: ModelConfig) -> str:
  if cfg.model_type == "kimi_k2":
    return KIMI_MODEL
  return {"v2": "deepseek2", "v3": "deepseek3", "v3.2": "deepseek3.2"}[_version(cfg)]


def _dims(cfg: ModelConfig) -> dict:
  heads = cfg.num_heads
  return dict(E=cfg.hidden_size, H=heads, nope=int(cfg.require("qk_nope_head_dim")),
              rope=int(cfg.require("qk_rope_head_dim")), v=int(cfg.require("v_head_dim")),
              kv_lora=int(cfg.require("kv_lora_rank")), q_lora=int(cfg.get("q_lora_rank") or 0),
              X=int(cfg.require("n_routed_experts")), Mm=int(cfg.require("moe_intermediate_size")),
              shared=int(cfg.get("n_shared_experts") or 0), K=int(cfg.get("first_k_dense_replace") or 0))


def _attention(cfg: ModelConfig) -> tuple[Param, ...]:
  d = _dims(cfg)
  E, H, qk, v = d["E"], d["H"], d["nope"] + d["rope"], d["v"]
  p = "self_attention"
  if d["q_lora"]:
    query = (
        Param(f"{p}/wq_a/kernel", f"{ATTN}.q_a_proj.weight", (d["q_lora"], E), (ops.Transpose(),)),
        Param(f"{p}/q_norm/scale", f"{ATTN}.q_a_layernorm.weight", (d["q_lora"],)),
        Param(f"{p}/wq_b/kernel", f"{ATTN}.q_b_proj.weight", (H * qk, d["q_lora"]),
              ops.to_heads_kernel(d["q_lora"], H, qk)),
    )
  else:
    query = (Param(f"{p}/query/kernel", f"{ATTN}.q_proj.weight", (H * qk, E), ops.to_heads_kernel(E, H, qk)),)
  params = query + (
      Param(f"{p}/wkv_a/kernel", f"{ATTN}.kv_a_proj_with_mqa.weight", (d["kv_lora"] + d["rope"], E),
            (ops.Transpose(),)),
      Param(f"{p}/kv_norm/scale", f"{ATTN}.kv_a_layernorm.weight", (d["kv_lora"],)),
      Param(f"{p}/wkv_b/kernel", f"{ATTN}.kv_b_proj.weight", (H * (d["nope"] + v), d["kv_lora"]),
            ops.to_heads_kernel(d["kv_lora"], H, d["nope"] + v)),
      Param(f"{p}/out/kernel", f"{ATTN}.o_proj.weight", (E, H * v), ops.to_out_kernel(E, H, v)),
  )
  if _version(cfg) == "v3.2":
    Hi, Di = int(cfg.require("index_n_heads")), int(cfg.require("index_head_dim"))
    idx, hf = f"{p}/indexer", f"{ATTN}.indexer"
    params += (
        Param(f"{idx}/wq_b/kernel", f"{hf}.wq_b.weight", (Hi * Di, d["q_lora"]),
              ops.to_heads_kernel(d["q_lora"], Hi, Di)),
        Param(f"{idx}/wk/kernel", f"{hf}.wk.weight", (Di, E), (ops.Transpose(),)),
        Param(f"{idx}/weights_proj/kernel", f"{hf}.weights_proj.weight", (Hi, E), (ops.Transpose(),)),
        Param(f"{idx}/k_norm/scale", f"{hf}.k_norm.weight", (Di,)),
        Param(f"{idx}/k_norm/bias", f"{hf}.k_norm.bias", (Di,)),
    )
  return params


def _moe(cfg: ModelConfig, target: str) -> tuple[Param, ...]:
  d = _dims(cfg)
  routed = common.moe_mlp(cfg, prefix=f"{MOE}/MoeBlock_0", router="mlp.gate", experts="mlp.experts", gate="gate_proj",
                          up="up_proj", down="down_proj", num_experts=d["X"], expert_dim=d["Mm"])
  shared = common.dense_mlp(cfg, f"{MOE}/shared_experts", f"{common.LAYER}.mlp.shared_experts", d["shared"] * d["Mm"])
  bias = ()
  if FAMILY.target_prefix(target) in ROUTED_BY_GROUPS:
    bias = (Param(f"{MOE}/MoeBlock_0/gate/bias", f"{common.LAYER}.mlp.gate.e_score_correction_bias", (d["X"],),
                  scan_axis=0),)
  return routed + bias + shared


def _layout(cfg: ModelConfig, target: str, target_vocab: int, scan_layers: bool) -> Layout:
  K, L = _dims(cfg)["K"], cfg.num_layers
  common_params = common.layer_norms(cfg) + _attention(cfg)
  dense = common_params + common.dense_mlp(cfg)
  moe = common_params + _moe(cfg, target)
  if scan_layers:
    groups = [LayerGroup(("decoder", "dense_layers"), tuple(range(K)), True, dense),
              LayerGroup(("decoder", "moe_layers"), tuple(range(K, L)), True, moe)]
    groups = [g for g in groups if g.layers]
  else:
    groups = ([LayerGroup(("decoder", f"dense_layers_{i}"), (i,), False, dense) for i in range(K)]
              + [LayerGroup(("decoder", f"moe_layers_{i - K}"), (i,), False, moe) for i in range(K, L)])
  return Layout(common.embeddings(cfg, target_vocab), tuple(groups))


def _runtime(cfg: ModelConfig, target: str) -> Runtime:
  return common.runtime(cfg, DECODER, **_overrides(cfg, target, []))


def _overrides(cfg: ModelConfig, target: str, warnings: list[str]) -> dict:
  d = _dims(cfg)
  by_groups = FAMILY.target_prefix(target) in ROUTED_BY_GROUPS
  overrides = dict(
      head_dim=None, base_moe_mlp_dim=d["Mm"], first_num_dense_layers=d["K"], num_experts=d["X"],
      num_experts_per_tok=int(cfg.require("num_experts_per_tok")), shared_experts=d["shared"],
      q_lora_rank=d["q_lora"], kv_lora_rank=d["kv_lora"], qk_nope_head_dim=d["nope"], qk_rope_head_dim=d["rope"],
      v_head_dim=d["v"], routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0),
      routed_score_func="sigmoid" if by_groups else "softmax", routed_bias=by_groups,
      n_routing_groups=int(cfg.get("n_group") or -1) if by_groups else -1,
      topk_routing_group=int(cfg.get("topk_group") or -1) if by_groups else -1,
      rope_interleave=bool(cfg.get("rope_interleave", True)),
      **common.yarn_rope(cfg, warnings, latent_attention=True),
  )
  if _version(cfg) == "v3.2":
    overrides.update(use_indexer=True, indexer_n_heads=int(cfg.require("index_n_heads")),
                     indexer_head_dim=int(cfg.require("index_head_dim")), indexer_topk=int(cfg.require("index_topk")))
  return overrides


def _check(cfg: ModelConfig, target: str) -> list[str]:
  version, prefix = _version(cfg), FAMILY.target_prefix(target)
  wanted = {"v2": ("deepseek2",), "v3": ("deepseek3", "kimi-k2"), "v3.2": ("deepseek3.2",)}[version]
  if prefix not in wanted:
    raise ConversionError(
        f"--target_model={target}: a DeepSeek {version.upper()} checkpoint ({cfg.architecture}) needs a MaxText"
        f" model named {' or '.join(t + '-*' for t in wanted)}: MaxText chooses the routing (and the gate bias) by"
        " model name"
    )
  if cfg.get("attention_bias"):
    raise ConversionError(f"{cfg.path}: attention_bias is true; MaxText's multi-head latent attention has no biases")
  if int(cfg.get("moe_layer_freq") or 1) != 1:
    raise ConversionError(f"{cfg.path}: moe_layer_freq={cfg.get('moe_layer_freq')}; MaxText's deepseek decoder has"
                          " MoE in every layer after the first_k_dense_replace dense ones")
  d = _dims(cfg)
  layer_kinds = cfg.get("mlp_layer_types")
  if layer_kinds and list(layer_kinds) != ["dense"] * d["K"] + ["sparse"] * (cfg.num_layers - d["K"]):
    raise ConversionError(f"{cfg.path}: mlp_layer_types {layer_kinds} is not first_k_dense_replace={d['K']} dense"
                          " layers then MoE layers, the only order MaxText's deepseek decoder has")
  if version == "v3.2" and not d["q_lora"]:
    raise ConversionError(f"{cfg.path}: q_lora_rank is null; MaxText's sparse indexer needs the low-rank query")
  warnings: list[str] = []
  _overrides(cfg, target, warnings)
  if version == "v2":
    method = cfg.get("topk_method") or "greedy"
    if method != "greedy":
      warnings.append(f"{cfg.path}: topk_method={method!r}; MaxText's {target} routes by a plain top-k over all"
                      f" experts (group-limited greedy routing over n_group={cfg.get('n_group')} is not reproduced)")
    if cfg.get("norm_topk_prob"):
      warnings.append(f"{cfg.path}: norm_topk_prob is true; MaxText's {target} does not renormalise softmax weights")
  else:
    if (cfg.get("scoring_func") or "sigmoid") != "sigmoid":
      warnings.append(f"{cfg.path}: scoring_func={cfg.get('scoring_func')!r}; MaxText's {target} routing uses sigmoid"
                      " scores")
    if not cfg.get("norm_topk_prob", True):
      warnings.append(f"{cfg.path}: norm_topk_prob is false, but MaxText always renormalises sigmoid router weights:"
                      " logits will differ from HF")
    groups = cfg.get("n_group") or 1
    if d["X"] % groups:
      raise ConversionError(f"{cfg.path}: n_routed_experts={d['X']} is not a multiple of n_group={groups}")
  if cfg.rms_norm_eps != LATENT_NORM_EPS:
    warnings.append(f"{cfg.path}: rms_norm_eps={cfg.rms_norm_eps:g}, but the latent attention's q_a_layernorm and"
                    f" kv_a_layernorm use {LATENT_NORM_EPS:g} in transformers and the checkpoint's own code; MaxText's"
                    f" {target} uses normalization_layer_epsilon={cfg.rms_norm_eps:g} for every norm, so logits differ"
                    " slightly (docs/families.md, Kimi)")
  if cfg.num_kv_heads != cfg.num_heads:
    warnings.append(f"{cfg.path}: num_key_value_heads={cfg.num_kv_heads} differs from num_attention_heads; latent"
                    " attention has one key/value per query head, so it is ignored")
  return warnings


def _ignored(cfg: ModelConfig) -> dict[str, str]:
  extra = int(cfg.get("num_nextn_predict_layers") or 0)
  ignored = dict(ROTARY_CACHES)
  if extra:
    layers = "|".join(str(cfg.num_layers + k) for k in range(extra))
    ignored[rf"model\.layers\.({layers})\."] = ("the multi-token-prediction layer(s) after the last decoder layer;"
                                                " MaxText's deepseek decoder does not read them")
  return ignored


def _config_back(config: dict) -> dict:
  """Kimi K2 and K2-Thinking name remote code (`model_type: kimi_k2`, `auto_map`) for what transformers runs as
  `deepseek_v3` (the rename its kimi_k25 applies to the same text config): written back as that."""
  if config.get("model_type") != "kimi_k2":
    return config
  return {**{k: v for k, v in config.items() if k != "auto_map"}, "model_type": "deepseek_v3"}


FAMILY = Family(
    name="deepseek",
    architectures=("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM"),
    targets=("deepseek2", "deepseek3", "deepseek3.2", "kimi-k2"),
    infer_target=_infer_target,
    runtime=_runtime,
    layout=_layout,
    check=_check,
    ignored_tensors=_ignored,
    config_back=_config_back,
)
