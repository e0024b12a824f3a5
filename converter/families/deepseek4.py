"""DeepSeek V4 (`deepseek4-*`, DeepSeek-V4-Flash): mHC hyper-connection mixers around every sublayer, hash-routed
first layers, sliding-window attention with compressed (HCA, ratio 128) or compressed-and-indexed (CSA, ratio 4)
entries, a grouped low-rank output projection and attention sinks.

Tensors are read under the hub's flat names (`layers.{i}.attn.wq_a.weight`, `embed.weight`, `head.weight`);
transformers' `save_pretrained` names (the same under `model.`, except the embedding, the final norm, the head
mixer and the attention's kv norm) are aliases of them. config.json may carry the hub's keys (`compress_ratios`,
`num_hash_layers`, `qk_rope_head_dim`, `compress_rope_theta`, `rope_scaling`) or transformers' (`layer_types`,
`compress_rates`, `mlp_layer_types`, `partial_rotary_factor`, `rope_parameters {main, compress}`).

Unscanned, every layer is `decoder/layers_{i}`. Scanned, MaxText keeps the `num_hash_layers` first layers unrolled
and stacks the rest as pairs: `decoder/scanned_blocks/layers_0` always a ratio-128 layer and `layers_1` always a
ratio-4 one, whatever `compress_ratios` says, so only that pattern converts scanned. The routing bias and the hash
table are written inside `params/params` (MaxText's own converter writes them as separate collections its loader
never fills). HF's mHC norm has no weight; MaxText's learns one, written as ones. The MTP block is skipped.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from converter import ops
from converter.errors import ConversionError
from converter.families import common
from converter.families.base import ROTARY_CACHES, Family, LayerGroup, Layout, Param
from converter.families.runtime import Decoder, Runtime
from converter.model_config import ModelConfig

LAYER = "layers.{layer}"
ATTN = f"{LAYER}.attn"
FFN = f"{LAYER}.ffn"
MOE = "mlp/MoeBlock_0"
DECODER = Decoder(attention="compressed", attention_sinks=True, routing="deepseek4", moe_block="MoeBlock_0",
                  forward="deepseek4")
SLIDING, CSA = 0, 4  # MaxText's compress ratios: 0 sliding window only, 4 CSA (with the indexer), above 4 HCA.
SCANNED_RATIOS = (128, 4)  # MaxText's scanned block: layers_0 HCA at 128, layers_1 CSA at 4 (models/deepseek4.py).
MAXTEXT_HC_EPS = 1e-6  # Hard-coded in MaxText's layers/mhc.py (Sinkhorn, pre mix, the head's norm).
# transformers' on-disk names (save_pretrained writes the hub's names under `model.`, but for these) -> the hub's.
SAVED_NAMES = (
    (r"^model\.embed_tokens\.weight$", "embed.weight"),
    (r"^model\.norm\.weight$", "norm.weight"),
    (r"^model\.hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"),
    (r"^model\.layers\.(\d+)\.attn\.norm\.weight$", r"layers.\1.attn.kv_norm.weight"),
    (r"^model\.(layers\..*)$", r"\1"),
)
_LAYER_TYPE_RATIOS = {"sliding_attention": None, "compressed_sparse_attention": 4,
                      "heavily_compressed_attention": 128}


@dataclasses.dataclass(frozen=True)
class Dims:
  """config.json's dimensions in either form (the hub's keys or transformers')."""

  E: int
  H: int
  D: int
  rope: int
  q_lora: int
  G: int
  o_lora: int
  N: int
  X: int
  M: int
  shared: int
  top_k: int
  Hi: int
  Di: int
  K: int  # Hash-routed first layers.
  ratios: tuple[int, ...]  # Per layer: 0 sliding window, 4 CSA, more HCA.
  ratios_key: str  # The config key the ratios come from (what errors name).


def _ratios(cfg: ModelConfig) -> tuple[tuple[int, ...], str]:
  """Per-layer compress ratios from `compress_ratios` (hub; it may list the MTP block's too) or `layer_types` +
  `compress_rates` (transformers); refuses what MaxText would compute another kind of attention for."""
  L = cfg.num_layers
  if cfg.get("compress_ratios") is not None:
    ratios, key = tuple(int(r) for r in cfg.get("compress_ratios")), "compress_ratios"
    if len(ratios) < L:
      raise ConversionError(f"{cfg.path}: compress_ratios has {len(ratios)} entries for {L} layers")
    ratios = ratios[:L]
    if any(r < 0 or 0 < r < CSA for r in ratios):
      raise ConversionError(f"{cfg.path}: compress_ratios {list(ratios)}: MaxText's deepseek4 decoder computes 0"
                            " (sliding window), 4 (CSA) or more than 4 (HCA) only")
    return ratios, key
  types = cfg.get("layer_types")
  if types is None:
    raise ConversionError(f"{cfg.path}: neither compress_ratios nor layer_types: the per-layer attention of"
                          f" {cfg.architecture} is unknown")
  rates = {**{k: v for k, v in _LAYER_TYPE_RATIOS.items() if v}, **(cfg.get("compress_rates") or {})}
  ratios = []
  for i, kind in enumerate(list(types)[:L]):
    if kind not in _LAYER_TYPE_RATIOS:
      raise ConversionError(f"{cfg.path}: layer_types[{i}]={kind!r} is not one of {list(_LAYER_TYPE_RATIOS)}")
    rate = int(rates[kind]) if _LAYER_TYPE_RATIOS[kind] else SLIDING
    if (kind == "compressed_sparse_attention") != (rate == CSA) or (rate and rate < CSA):
      raise ConversionError(f"{cfg.path}: compress_rates[{kind!r}]={rate}: MaxText's deepseek4 decoder makes a layer"
                            f" CSA exactly when its ratio is {CSA} and HCA when it is larger")
    ratios.append(rate)
  return tuple(ratios), "layer_types"


def _hash_layers(cfg: ModelConfig) -> int:
  """`num_hash_layers` (hub) or the leading "hash_moe" entries of `mlp_layer_types` (transformers; default 3)."""
  if cfg.get("num_hash_layers") is not None:
    return int(cfg.get("num_hash_layers"))
  kinds = cfg.get("mlp_layer_types")
  if kinds is None:
    return 3  # transformers' DeepseekV4Config default.
  K = next((i for i, kind in enumerate(kinds) if kind != "hash_moe"), len(kinds))
  if "hash_moe" in kinds[K:]:
    raise ConversionError(f"{cfg.path}: mlp_layer_types {list(kinds)} has hash-routed layers after top-k ones;"
                          " MaxText's deepseek4 decoder hash-routes its first first_num_hash_layers layers only")
  return K


def _dims(cfg: ModelConfig) -> Dims:
  D = cfg.head_dim
  rope = cfg.get("qk_rope_head_dim")
  if rope is None:
    rope = round(D * float(cfg.get("partial_rotary_factor") or 64 / 512))
  ratios, key = _ratios(cfg)
  return Dims(E=cfg.hidden_size, H=cfg.num_heads, D=D, rope=int(rope), q_lora=int(cfg.require("q_lora_rank")),
              G=int(cfg.require("o_groups")), o_lora=int(cfg.require("o_lora_rank")), N=int(cfg.require("hc_mult")),
              X=int(cfg.require("n_routed_experts")), M=int(cfg.require("moe_intermediate_size")),
              shared=int(cfg.get("n_shared_experts", 1) or 0), top_k=int(cfg.require("num_experts_per_tok")),
              Hi=int(cfg.require("index_n_heads")), Di=int(cfg.require("index_head_dim")), K=_hash_layers(cfg),
              ratios=ratios, ratios_key=key)


def _mixer(d: Dims, maxtext: str, hf: str) -> tuple[Param, ...]:
  """One mHC mixer: HF's fn ((2+N)N, N*E), base ((2+N)N) and scale (3), each split into its pre, post and
  residual parts (fn rows transposed into (N*E, ·) kernels, the residual base (N, N) row-major), plus the norm
  scale MaxText learns and HF fixes at ones."""
  N, NE = d.N, d.N * d.E
  rows = (N, N, N * N)
  params = [Param(f"{maxtext}/mhc_norm/scale", "", (NE,), constant=1.0)]
  for k, part in enumerate(("pre", "post", "res")):
    params += [
        Param(f"{maxtext}/{part}_alpha", f"{hf}_fn", ((2 + N) * N, NE), (ops.Slot(0, 1, rows, k), ops.Transpose()),
              keep_float32=True),
        Param(f"{maxtext}/{part}_beta", f"{hf}_base", ((2 + N) * N,),
              (ops.Slot(0, 1, rows, k),) + ((ops.Reshape((N, N)),) if part == "res" else ()), keep_float32=True),
        Param(f"{maxtext}/{part}_alpha_scale", f"{hf}_scale", (3,), (ops.Slot(0, 1, (1, 1, 1), k),),
              keep_float32=True),
    ]
  return tuple(params)


def _compressor(prefix: str, hf: str, E: int, D: int, ratio: int, overlap: bool) -> tuple[Param, ...]:
  """A compressor's kv and gate projections, norm and per-position bias (`ape`); CSA's pools overlapping
  windows, so its projections are twice as wide."""
  width = 2 * D if overlap else D
  return (
      Param(f"{prefix}/kv_proj/kernel", f"{hf}.wkv.weight", (width, E), (ops.Transpose(),)),
      Param(f"{prefix}/gate_proj/kernel", f"{hf}.wgate.weight", (width, E), (ops.Transpose(),)),
      Param(f"{prefix}/kv_norm/scale", f"{hf}.norm.weight", (D,)),
      Param(f"{prefix}/position_bias", f"{hf}.ape", (ratio, width), keep_float32=True),
  )


def _attention(d: Dims, ratio: int) -> tuple[Param, ...]:
  E, H, D, G = d.E, d.H, d.D, d.G
  p = "self_attention"
  params = (
      Param(f"{p}/wq_a/kernel", f"{ATTN}.wq_a.weight", (d.q_lora, E), (ops.Transpose(),),
            logical_axes=("embed_attn", "q_lora")),
      Param(f"{p}/q_norm/scale", f"{ATTN}.q_norm.weight", (d.q_lora,)),
      Param(f"{p}/wq_b/kernel", f"{ATTN}.wq_b.weight", (H * D, d.q_lora), ops.to_heads_kernel(d.q_lora, H, D)),
      Param(f"{p}/wkv/kernel", f"{ATTN}.wkv.weight", (D, E), ops.to_heads_kernel(E, 1, D)),
      Param(f"{p}/kv_norm/scale", f"{ATTN}.kv_norm.weight", (D,)),
      Param(f"{p}/sinks", f"{ATTN}.attn_sink", (H,), keep_float32=True),
      # Each group's (o_lora, H*D/G) block of wo_a transposed on its own: (G, H*D/G, o_lora).
      Param(f"{p}/o_a_proj/kernel", f"{ATTN}.wo_a.weight", (G * d.o_lora, H * D // G),
            (ops.Reshape((G, d.o_lora, H * D // G)), ops.Permute((0, 2, 1)))),
      Param(f"{p}/o_b_proj/kernel", f"{ATTN}.wo_b.weight", (E, G * d.o_lora), (ops.Transpose(),)),
  )
  if ratio == CSA:
    csa = f"{p}/csa_compressor"
    params += _compressor(csa, f"{ATTN}.compressor", E, D, ratio, overlap=True) + _compressor(
        f"{csa}/indexer", f"{ATTN}.indexer.compressor", E, d.Di, ratio, overlap=True) + (
            Param(f"{csa}/indexer/q_proj/kernel", f"{ATTN}.indexer.wq_b.weight", (d.Hi * d.Di, d.q_lora),
                  (ops.Transpose(),)),
            Param(f"{csa}/indexer/weights_proj/kernel", f"{ATTN}.indexer.weights_proj.weight", (d.Hi, E),
                  (ops.Transpose(),)))
  elif ratio:
    params += _compressor(f"{p}/hca_compressor", f"{ATTN}.compressor", E, D, ratio, overlap=False)
  return params


def _moe(cfg: ModelConfig, d: Dims, hashed: bool) -> tuple[Param, ...]:
  """Routed experts (w1, w3, w2 per expert) with the hash table (hash-routed layers) or the routing bias (the
  others; layer axis first when scanned, as MaxText's MoEBiasVar), and the shared experts."""
  routed = common.moe_mlp(cfg, prefix=MOE, router="ffn.gate", experts="ffn.experts", gate="w1", up="w3", down="w2",
                          num_experts=d.X, expert_dim=d.M, layer=LAYER)
  if hashed:
    routing = (Param(f"{MOE}/tid2eid", f"{FFN}.gate.tid2eid", (cfg.vocab_size, d.top_k), (ops.IntegerIds(d.X),)),)
  else:
    routing = (Param(f"{MOE}/gate/bias", f"{FFN}.gate.bias", (d.X,), scan_axis=0, keep_float32=True),)
  width = d.shared * d.M
  shared = (
      Param("mlp/shared_experts/wi_0/kernel", f"{FFN}.shared_experts.w1.weight", (width, d.E), (ops.Transpose(),)),
      Param("mlp/shared_experts/wi_1/kernel", f"{FFN}.shared_experts.w3.weight", (width, d.E), (ops.Transpose(),)),
      Param("mlp/shared_experts/wo/kernel", f"{FFN}.shared_experts.w2.weight", (d.E, width), (ops.Transpose(),)),
  )
  return routed + routing + shared


def _layer(cfg: ModelConfig, d: Dims, layer: int) -> tuple[Param, ...]:
  return ((Param("pre_self_attention_layer_norm/scale", f"{LAYER}.attn_norm.weight", (d.E,)),
           Param("post_self_attention_layer_norm/scale", f"{LAYER}.ffn_norm.weight", (d.E,)))
          + _mixer(d, "mhc_attention", f"{LAYER}.hc_attn") + _mixer(d, "mhc_mlp", f"{LAYER}.hc_ffn")
          + _attention(d, d.ratios[layer]) + _moe(cfg, d, layer < d.K))


def _scanned_blocks(cfg: ModelConfig, d: Dims) -> int:
  """How many (128, 4) pairs follow the hash layers; refuses what MaxText's scanned decoder cannot hold."""
  rest = d.ratios[d.K:]
  if len(rest) % 2 or any(r != SCANNED_RATIOS[i % 2] for i, r in enumerate(rest)):
    raise ConversionError(
        f"{cfg.path}: {d.ratios_key} gives the layers after the first {d.K} (num_hash_layers) the ratios"
        f" {list(rest)}; scanned, MaxText's deepseek4 decoder holds only pairs of a ratio-128 and a ratio-4 layer"
        " there (and drops an odd last layer): convert with --scan_layers=false")
  return len(rest) // 2


def _layout(cfg: ModelConfig, target: str, target_vocab: int, scan_layers: bool) -> Layout:
  d = _dims(cfg)
  V, E, N = cfg.vocab_size, d.E, d.N
  top = (
      Param("token_embedder/embedding", "embed.weight", (V, E), (ops.PadRows(target_vocab),)),
      Param("decoder/decoder_norm/scale", "norm.weight", (E,)),
      Param("decoder/logits_dense/kernel", "head.weight", (V, E), (ops.Transpose(), ops.PadColumns(target_vocab))),
      Param("decoder/hc_head/hc_fn", "hc_head_fn", (N, N * E), (ops.Transpose(),), keep_float32=True),
      Param("decoder/hc_head/hc_base", "hc_head_base", (N,), keep_float32=True),
      Param("decoder/hc_head/hc_scale", "hc_head_scale", (1,), keep_float32=True),
  )
  unrolled = d.K if scan_layers else cfg.num_layers
  groups = [LayerGroup(("decoder", f"layers_{i}"), (i,), False, _layer(cfg, d, i)) for i in range(unrolled)]
  if scan_layers:
    blocks = _scanned_blocks(cfg, d)
    groups += [LayerGroup(("decoder", "scanned_blocks", f"layers_{j}"),
                          tuple(d.K + 2 * b + j for b in range(blocks)), True, _layer(cfg, d, d.K + j),
                          axis_names=("scanned_blocks",))
               for j in range(2 if blocks else 0)]
  return Layout(top, tuple(groups))


def _rope(cfg: ModelConfig) -> tuple[float, float, dict[str, Any], dict[str, Any], str]:
  """(main theta, compressed theta, main scaling, compressed scaling, the key the scaling comes from)."""
  nested = cfg.get("rope_parameters") or {}
  if isinstance(nested.get("main"), dict) and isinstance(nested.get("compress"), dict):
    main, compress = nested["main"], nested["compress"]
    return (float(main.get("rope_theta", cfg.rope_theta)), float(compress.get("rope_theta", 160000.0)), main,
            compress, "rope_parameters")
  scaling = common.rope_parameters(cfg)
  key = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
  # The hub's rope_scaling applies to the compressed layers only (DeepSeek's reference and transformers).
  return cfg.rope_theta, float(cfg.get("compress_rope_theta", 160000.0)), {}, scaling, key


def _overrides(cfg: ModelConfig) -> dict[str, Any]:
  d = _dims(cfg)
  main_theta, compress_theta, _, _, _ = _rope(cfg)
  return dict(
      head_dim=d.D, qk_rope_head_dim=d.rope, base_mlp_dim=d.M, base_moe_mlp_dim=d.M, num_experts=d.X,
      num_experts_per_tok=d.top_k, shared_experts=d.shared, norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
      routed_scaling_factor=float(cfg.get("routed_scaling_factor") or 1.0), routed_score_func="sqrtsoftplus",
      routed_bias=True, mlp_activations_limit=float(cfg.require("swiglu_limit")), q_lora_rank=d.q_lora,
      o_groups=d.G, o_lora_rank=d.o_lora, mhc_expansion_rate=d.N,
      sinkhorn_iterations=int(cfg.get("hc_sinkhorn_iters", 20)), first_num_hash_layers=d.K,
      compress_ratios=d.ratios, use_indexer=True, indexer_n_heads=d.Hi, indexer_head_dim=d.Di,
      indexer_topk=int(cfg.require("index_topk")), sliding_window_size=int(cfg.require("sliding_window")),
      rope_max_timescale=main_theta, compressed_rope_max_timescale=compress_theta,
  )


def _runtime(cfg: ModelConfig, target: str) -> Runtime:
  return common.runtime(cfg, DECODER, **_overrides(cfg))


def _check(cfg: ModelConfig, target: str) -> list[str]:
  d = _dims(cfg)
  if d.K > cfg.num_layers:
    raise ConversionError(f"{cfg.path}: num_hash_layers={d.K} exceeds num_hidden_layers={cfg.num_layers}")
  if cfg.num_kv_heads != 1:
    raise ConversionError(f"{cfg.path}: num_key_value_heads={cfg.num_kv_heads}; DeepSeek V4 attention has one shared"
                          " key/value head")
  if d.H * d.D % d.G:
    raise ConversionError(f"{cfg.path}: o_groups={d.G} does not divide num_attention_heads x head_dim")
  warnings = []
  _, _, main, compress, key = _rope(cfg)
  for which, scaling in (("sliding-window", main), ("compressed", compress)):
    if common.rope_kind(scaling) != "default":
      warnings.append(f"{cfg.path}: {key} asks for {common.rope_kind(scaling)} rope scaling on the {which} layers"
                      f" ({ {k: v for k, v in scaling.items() if k != 'rope_theta'} }); MaxText 0.2.5's deepseek4"
                      " decoder applies plain rope, so logits differ from HF (by about 1 on a tiny model at 256"
                      " tokens)")
  hc_eps = float(cfg.get("hc_eps", MAXTEXT_HC_EPS))
  if hc_eps != MAXTEXT_HC_EPS:
    warnings.append(f"{cfg.path}: hc_eps={hc_eps}; MaxText's mHC hard-codes {MAXTEXT_HC_EPS}: logits will differ")
  if cfg.rms_norm_eps != MAXTEXT_HC_EPS:
    warnings.append(f"{cfg.path}: rms_norm_eps={cfg.rms_norm_eps}; MaxText's mHC head norm hard-codes"
                    f" {MAXTEXT_HC_EPS}: logits will differ slightly")
  if (cfg.get("scoring_func") or "sqrtsoftplus") != "sqrtsoftplus":
    warnings.append(f"{cfg.path}: scoring_func={cfg.get('scoring_func')!r}; MaxText's {target} routes by"
                    " sqrtsoftplus scores")
  if d.shared:
    warnings.append(f"{cfg.path}: swiglu_limit={cfg.require('swiglu_limit')} clamps the shared expert's gate and up"
                    " projections in HF; MaxText clamps the routed experts only, so logits differ wherever a"
                    " shared-expert activation exceeds it")
  return warnings


def _ignored(cfg: ModelConfig) -> dict[str, str]:
  return {**ROTARY_CACHES, r"^(model\.)?mtp\.": "the multi-token-prediction block (num_nextn_predict_layers);"
                                                 " MaxText's deepseek4 decoder does not read it"}


FAMILY = Family(
    name="deepseek4",
    architectures=("DeepseekV4ForCausalLM",),
    targets=("deepseek4",),
    infer_target=common.single_target("deepseek4-284b"),
    runtime=_runtime,
    layout=_layout,
    check=_check,
    ignored_tensors=_ignored,
    tensor_aliases=lambda cfg: SAVED_NAMES,
)
