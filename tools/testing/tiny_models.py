"""Random tiny HF models for tests and validation, built with transformers (test-only: imports torch).

Every parameter is drawn at random, norm scales, biases, attention sinks and DeepSeek's routing bias included:
transformers initialises norms to 1 (or 0 for Gemma's `1 + w`) and biases to 0, which would let a converter that
drops or misplaces one pass every logits check.

Each row also says what converting it must give (family, inferred target) and the MaxText 0.2.5 model it runs
as in the interop check: adding a family is its file in converter/families/ plus one row here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from tools import weaver_checkpoint


@dataclasses.dataclass(frozen=True)
class Fp8Shipping:
  """A row shipped as an FP8 checkpoint: the weights quantized (a regex named in tools/quantize.py), the block size,
  the dtype its scales are stored in, and the function of tools/quantize.py that ships it: `quantize_fp8`
  (`X.weight_scale_inv` beside every FP8 weight: DeepSeek V3, Qwen3.5) or `quantize_deepseek4` (DeepSeek V4's
  `.scale` naming, routed experts packed FP4)."""

  weights: str
  block: tuple[int, int]
  scale_dtype: str = "float32"
  quantizer: str = "quantize_fp8"


@dataclasses.dataclass(frozen=True)
class TinyModelSpec:
  """A random tiny model, and what converting it must give: the family and inferred target recorded, and the
  MaxText 0.2.5 model config the interop check runs it as ("" for none)."""

  config_class: str  # A transformers config class name.
  model_class: str
  config: dict[str, Any]
  family: str
  target: str
  maxtext_model: str = ""
  scans: tuple[bool, ...] = (True, False)  # The scan_layers values MaxText has for the model (Gemma 4 small: False).
  # Norm weights drawn around 0 instead of 1 (a regex of their names): those applied as 1 + w (Qwen3-Next, so that
  # the scale is ~1), and Gemma 4's q/k norms (its attention is unscaled; see _GEMMA4_QK_NORMS).
  norms_near_zero: str = ""
  fp8: Fp8Shipping | None = None  # Shipped quantized: every check runs on its numpy dequantization's logits.
  converter_flags: tuple[str, ...] = ()  # What every conversion of the row passes (--keep_fp8).
  # Multimodal rows: the module of tools/multimodal_inputs/ that makes their image (+ audio) + text case for the
  # interop check, and MaxText 0.2.5's own arithmetic floor on it as shipped (maxtext-contract-multimodal.md,
  # section 2), which the check reports beside the aligned forward it holds to --atol.
  inputs: str = ""
  shipped_floor: float = 0.0
  # Written in the hub's own layout, not save_pretrained's: tensor names and config.json keys as the hub ships them
  # (`hub_layout(save_pretrained's directory)` rewrites it in place; `hub_config(config.json)` the config alone).
  hub_layout: Callable[[str], None] | None = None
  hub_config: Callable[[dict[str, Any]], dict[str, Any]] | None = None
  seq_len: int = 0  # Tokens per sequence the logits checks run (0: their default).
  # Tensors drawn ~ N(0, 1) (a regex of their names): DeepSeek V4's mHC mixer scales and biases, compressor position
  # biases and sinks, which at 0.05 would leave the mixers near their uniform point, where a misplaced split hardly
  # changes the logits.
  unit_scale: str = ""
  # The largest max|diff| the float32 logits checks of tools/forward.py allow (0: validate_lib.Thresholds' default).
  logits_atol: float = 0.0


# Shared shape of the tiny models: head_dim differs from hidden / heads, queries are grouped 3:1, odd vocab.
_DENSE = dict(hidden_size=192, num_hidden_layers=4, vocab_size=509, num_attention_heads=6, num_key_value_heads=2,
              head_dim=40, intermediate_size=320, max_position_embeddings=512, rms_norm_eps=1e-5,
              tie_word_embeddings=False)
_LLAMA31_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
# Gemma: tied embeddings, E=256 (sqrt(E)=16 exact), head_dim 48 != hidden/heads 64, rms_norm_eps 1e-6 (MaxText's
# gemma layer norms fix it); sliding window 8 < the 32-token test sequences; soft caps small enough to bend.
_GEMMA = dict(hidden_size=256, vocab_size=509, num_attention_heads=4, num_key_value_heads=2, head_dim=48,
              intermediate_size=320, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True)
# DeepSeek: 1 dense + 2 MoE layers, low-rank queries, yarn factor 40 (as V3), 8 experts in 4 routing groups.
_DEEPSEEK = dict(hidden_size=192, num_hidden_layers=3, vocab_size=509, num_attention_heads=6, num_key_value_heads=6,
                 q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=24, qk_rope_head_dim=16, v_head_dim=40,
                 intermediate_size=256, moe_intermediate_size=48, n_routed_experts=8, num_experts_per_tok=3,
                 n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5, n_group=4, topk_group=2,
                 norm_topk_prob=True, rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=163840,
                 rope_parameters={"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                                  "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                  "rope_theta": 10000.0})
# GPT-OSS: a 4-token window (< the test sequences) on every other layer, sinks, biases, yarn; E and M multiples of
# 32 so that the MXFP4 test can pack them.
_GPT_OSS = dict(hidden_size=192, num_hidden_layers=4, vocab_size=509, num_attention_heads=6, num_key_value_heads=2,
                head_dim=40, intermediate_size=128, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
                rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=131072, swiglu_limit=7.0,
                rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                 "truncate": False, "original_max_position_embeddings": 4096, "rope_theta": 150000.0})
# Llama 4: chunks of 4 tokens (< the test sequences), NoPE every 4th layer, 8 layers = 2 scanned blocks of 4.
_LLAMA4 = dict(hidden_size=192, num_hidden_layers=8, vocab_size=509, num_attention_heads=6, num_key_value_heads=2,
               head_dim=40, intermediate_size=64, intermediate_size_mlp=256, num_local_experts=4, num_experts_per_tok=1,
               rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=131072, attention_chunk_size=4,
               no_rope_layer_interval=4, attn_temperature_tuning=True)

# Qwen3-Next / Qwen3.5: 8 layers = 2 cycles of 3 linear-attention layers and 1 full-attention layer (2 blocks != 3
# layers a block, so swapped stacking axes show), 2 key heads of 4 value heads, head_dim 48 != hidden/heads,
# partial rotary 0.25.
_HYBRID = dict(hidden_size=128, num_hidden_layers=8, vocab_size=509, num_attention_heads=4, num_key_value_heads=2,
               head_dim=48, intermediate_size=256, moe_intermediate_size=64, shared_expert_intermediate_size=64,
               num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, linear_num_key_heads=2,
               linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24, linear_conv_kernel_dim=4,
               rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=512,
               rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25})
_HYBRID_CENTRED_NORMS = r".*(layernorm|q_norm|k_norm|model\.norm)\.weight$"  # Not the gated norm (a plain scale).
# OLMo 3: sliding windows of 4 tokens on 3 layers of 4, q/k norms over all heads, post-norms only.
_OLMO3 = dict(_DENSE, num_hidden_layers=8, sliding_window=4, eos_token_id=0, pad_token_id=1,
              rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}})
# Gemma 4: Gemma's dims (tied, E=256), 12 layers = 2 scanned blocks of 5 sliding + 1 global layer (2 blocks != 5
# layers a block, so swapped stacking axes show), global heads of 96 != 48 (a quarter of each turned by rope), window 8
# < the 32-token test sequences, soft cap 10; no per-layer inputs (transformers' default is 256 of them). Gemma 4
# attends unscaled (HF scaling 1; trained q/k norm scales absorb 1/sqrt(head_dim)): with q/k norm scales ~1 the
# random model's attention is nearly one-hot and chaotic (transformers float32 vs float64: 0.94 in the logits), so
# they are drawn around 0 (`norms_near_zero`): 2.2e-5.
_GEMMA4_QK_NORMS = r".*self_attn\.(q_norm|k_norm)\.weight$"
_GEMMA4 = dict(_GEMMA, num_hidden_layers=12, global_head_dim=96, sliding_window=8, final_logit_softcapping=10.0,
               hidden_size_per_layer_input=0,
               rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                   "rope_theta": 1e6}})

# The Qwen vision tower (Qwen3-VL, Qwen3.5): 3 blocks of hidden 32 in 2 heads of 16 (per-head and thirds splits of the
# fused qkv differ), MLP 48, 4x4 patches over 2 frames, 2x2 merges, a 4x4 position table interpolated to the
# case's 6x8-patch image (tools/multimodal_inputs/qwen_vl.py: swapped grid axes change values). The vocabularies sit
# just above MaxText's hard-coded image placeholder ids (151655, Qwen3.5 248056): transformers embeds them before
# replacing them, MaxText clamps them.
_QWEN_VISION = dict(depth=3, hidden_size=32, num_heads=2, intermediate_size=48, patch_size=4, temporal_patch_size=2,
                    spatial_merge_size=2, num_position_embeddings=16, hidden_act="gelu_pytorch_tanh", in_channels=3)
# Qwen3-VL text: 4 layers (deepstack features enter after layers 0 and 1), head_dim 32 != hidden/heads, MRoPE
# sections (6, 5, 5) of head_dim/2 (unequal: swapped sections change values).
_QWEN3_VL_TEXT = dict(hidden_size=64, num_hidden_layers=4, vocab_size=151657, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, intermediate_size=128, rms_norm_eps=1e-6,
                      max_position_embeddings=512,
                      rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [6, 5, 5],
                                       "mrope_interleaved": True})

# DeepSeek V4: 3 hash-routed layers (sliding, sliding, CSA) then 2 scanned pairs (HCA 128, CSA 4); head_dim 64 !=
# hidden/heads, rope on the last 16 channels, 4 output groups, 3 mHC streams, 8 experts top 3 of 96, an indexer
# of 32 heads x 16 keeping 8 entries, window 48; rope bases, routed scale and the clamp differ from
# deepseek4-284b.yml's, so an override left at the yml's value changes the logits. Run on 256 tokens: the
# ratio-128 compressor emits two entries and the indexer picks 8 of up to 64.
_DEEPSEEK4 = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=1, head_dim=64, qk_rope_head_dim=16,
                  q_lora_rank=48, o_groups=4, o_lora_rank=32, hc_mult=3, hc_sinkhorn_iters=20, num_hidden_layers=7,
                  compress_ratios=[0, 0, 4, 128, 4, 128, 4], num_hash_layers=3, n_routed_experts=8,
                  num_experts_per_tok=3, moe_intermediate_size=96, n_shared_experts=1, index_n_heads=32,
                  index_head_dim=16, index_topk=8, sliding_window=48, rope_theta=20000.0, compress_rope_theta=80000.0,
                  routed_scaling_factor=2.0, swiglu_limit=6.0, vocab_size=509, rms_norm_eps=1e-6,
                  max_position_embeddings=4096, num_nextn_predict_layers=0, tie_word_embeddings=False)
_DEEPSEEK4_UNIT_SCALE = r".*((attn_hc|ffn_hc)\.(scale|base)|hc_head\.hc_(scale|base)|position_bias|self_attn\.sinks)$"
# transformers' save_pretrained names of a DeepSeek V4 -> the hub's flat ones (the inverse of what the converter's
# deepseek4 family aliases; written here independently of it).
_DEEPSEEK4_HUB_NAMES = ((r"^model\.embed_tokens\.weight$", "embed.weight"), (r"^model\.norm\.weight$", "norm.weight"),
                        (r"^model\.hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"),
                        (r"^model\.layers\.(\d+)\.attn\.norm\.weight$", r"layers.\1.attn.kv_norm.weight"),
                        (r"^model\.", ""))


# Kimi K2-Thinking / K2.5 / K2.6 (maxtext-contract-kimi-int4.md's tiny models): hidden 224 over 6 heads (not whole:
# latent attention sizes its heads itself), 1 dense + 3 MoE layers, 10 experts top 3 of 96 in one routing group,
# sigmoid routing scaled 2.827, yarn 16 with Kimi's beta 1 / 1; routed experts shipped INT4 in groups of 16 (Kimi:
# 32), so that the 96-wide down_proj has 6 groups a row and the scales, spread over 2^-2..2^3, show a wrong axis.
_KIMI = dict(hidden_size=224, num_hidden_layers=4, vocab_size=419, num_attention_heads=6, num_key_value_heads=6,
             q_lora_rank=80, kv_lora_rank=48, qk_nope_head_dim=24, qk_rope_head_dim=16, v_head_dim=40,
             intermediate_size=288, moe_intermediate_size=96, n_routed_experts=10, num_experts_per_tok=3,
             n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.827, n_group=1, topk_group=1,
             norm_topk_prob=True, rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=4096,
             rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 256,
                              "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                              "rope_theta": 30000.0})
# MoonViT at reduced size: 2 blocks of hidden 32 in 2 heads, 4x4 patches; never converted (MaxText has no form).
_KIMI_VISION = dict(patch_size=4, pos_emb_height=4, pos_emb_width=4, pos_emb_time=2, num_attention_heads=2,
                    num_hidden_layers=2, hidden_size=32, intermediate_size=48, merge_kernel_size=[2, 2])
_KIMI_INT4 = Fp8Shipping("KIMI_INT4_WEIGHTS", (1, 16), "bfloat16", quantizer="quantize_compressed_int4")


def kimi_hub_config(config: dict[str, Any]) -> dict[str, Any]:
  """The hub's config.json: remote code's names (`kimi_k2`; K2.5's `KimiK25ForConditionalGeneration`), no
  `head_dim` (transformers writes qk_rope_head_dim there)."""
  text = config.get("text_config", config)
  text.pop("head_dim", None)
  text["model_type"] = "kimi_k2"
  if "text_config" in config:
    config["architectures"] = ["KimiK25ForConditionalGeneration"]
  return config


def kimi_hub_layout(directory: str) -> None:
  """Rewrites a save_pretrained directory in place as the hub ships it: K2.5's text layers under
  `language_model.model.layers.{i}` and its projector's norm under `mm_projector.` (transformers 5.24 saves
  `...model.blocks.{i}` and `model.mm_projector.pre_norm`), the hub's config."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  from tools.safetensors_writer import write_safetensors  # pylint: disable=g-import-not-at-top

  path = os.path.join(directory, "model.safetensors")
  saved_names = ((r"^language_model\.model\.blocks\.", "language_model.model.layers."),
                 (r"^model\.mm_projector\.", "mm_projector."))
  tensors = {}
  for name, value in load_file(path).items():
    for pattern, replacement in saved_names:
      name = re.sub(pattern, replacement, name)
    tensors[name] = value
  write_safetensors(path, tensors)
  with open(os.path.join(directory, "config.json")) as f:
    config = kimi_hub_config(json.load(f))
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f, indent=2)


def deepseek4_hub_config(config: dict[str, Any]) -> dict[str, Any]:
  """A DeepSeek V4 config.json in transformers' form -> the hub's keys (per-layer `compress_ratios`,
  `num_hash_layers`, `qk_rope_head_dim`, flat `rope_theta` / `compress_rope_theta`)."""
  rates = {"sliding_attention": 0, **config["compress_rates"]}
  rope = config["rope_parameters"]
  hub = {k: v for k, v in config.items() if k not in ("layer_types", "mlp_layer_types", "compress_rates",
                                                     "rope_parameters", "partial_rotary_factor")}
  return dict(hub, compress_ratios=[rates[t] for t in config["layer_types"]],
              num_hash_layers=config["mlp_layer_types"].count("hash_moe"),
              qk_rope_head_dim=round(config["head_dim"] * config["partial_rotary_factor"]),
              rope_theta=rope["main"]["rope_theta"], compress_rope_theta=rope["compress"]["rope_theta"])


def deepseek4_hub_layout(directory: str) -> None:
  """Rewrites a DeepSeek V4 save_pretrained directory in place as the hub ships it: flat names, hub config keys."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  from tools.safetensors_writer import write_safetensors  # pylint: disable=g-import-not-at-top

  path = os.path.join(directory, "model.safetensors")
  tensors = {}
  for name, value in load_file(path).items():
    pattern, replacement = next((p, r) for p, r in _DEEPSEEK4_HUB_NAMES + ((r"^", ""),) if re.match(p, name))
    tensors[re.sub(pattern, replacement, name, count=1)] = value
  write_safetensors(path, tensors)
  with open(os.path.join(directory, "config.json")) as f:
    config = deepseek4_hub_config(json.load(f))
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)


TINY_MODELS: dict[str, TinyModelSpec] = {
    "qwen3": TinyModelSpec(
        "Qwen3Config", "Qwen3ForCausalLM",
        dict(hidden_size=256, num_hidden_layers=8, vocab_size=512, num_attention_heads=4, num_key_value_heads=2,
             head_dim=96, intermediate_size=512, rope_theta=1e6, max_position_embeddings=512, rms_norm_eps=1e-6,
             tie_word_embeddings=False),
        "qwen3", "qwen3", "qwen3-8b"),
    "llama2": TinyModelSpec("LlamaConfig", "LlamaForCausalLM", dict(_DENSE, rope_theta=10000.0), "llama", "llama2",
                            "llama2-7b"),
    "llama3": TinyModelSpec("LlamaConfig", "LlamaForCausalLM", dict(_DENSE, rope_theta=500000.0), "llama", "llama3",
                            "llama3-8b"),
    "llama3.1": TinyModelSpec("LlamaConfig", "LlamaForCausalLM",
                              dict(_DENSE, rope_parameters=_LLAMA31_SCALING, max_position_embeddings=131072),
                              "llama", "llama3.1", "llama3.1-8b"),
    "llama3.2_tied": TinyModelSpec("LlamaConfig", "LlamaForCausalLM",
                                   dict(_DENSE, rope_parameters=_LLAMA31_SCALING, max_position_embeddings=131072,
                                        tie_word_embeddings=True),
                                   "llama", "llama3.1", "llama3.1-8b"),
    "mistral": TinyModelSpec("MistralConfig", "MistralForCausalLM", dict(_DENSE, rope_theta=1e6, sliding_window=None),
                             "mistral", "mistral", "mistral-7b"),
    "qwen2": TinyModelSpec("Qwen2Config", "Qwen2ForCausalLM", dict(_DENSE, rope_theta=1e6), "qwen2", "qwen2.5",
                           "qwen2.5-7b"),
    "qwen3_moe": TinyModelSpec(
        "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
        dict(_DENSE, rope_theta=1e6, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=96,
             norm_topk_prob=True),
        "qwen3_moe", "qwen3", "qwen3-30b-a3b"),
    "mixtral": TinyModelSpec(
        "MixtralConfig", "MixtralForCausalLM",
        dict(_DENSE, rope_theta=1e6, num_local_experts=4, num_experts_per_tok=2, intermediate_size=96),
        "mixtral", "mixtral", "mixtral-8x7b"),
    # Qwen3-30B-A3B's structure at reduced size: 48 -> 4 layers, 128 -> 8 experts (top 8 -> top 2), hidden 2048 ->
    # 128, 32 -> 8 query and 4 -> 2 KV heads of head_dim 128 -> 32 (so H*D = 2 * hidden, as in the original),
    # moe_intermediate 768 -> 48, vocab 151936 -> 512; norm_topk_prob true, every layer sparse, untied.
    "qwen3_30b_a3b_tiny": TinyModelSpec(
        "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
        dict(hidden_size=128, num_hidden_layers=4, vocab_size=512, num_attention_heads=8, num_key_value_heads=2,
             head_dim=32, intermediate_size=384, moe_intermediate_size=48, num_experts=8, num_experts_per_tok=2,
             norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], rope_theta=1e6,
             max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False),
        "qwen3_moe", "qwen3"),
    "gemma": TinyModelSpec("GemmaConfig", "GemmaForCausalLM",
                           dict(_GEMMA, num_hidden_layers=3, num_key_value_heads=1, hidden_act="gelu_pytorch_tanh"),
                           "gemma", "gemma", "gemma-2b"),
    # 4 HF layers (2 MaxText layers); query_pre_attn_scalar = hidden/heads != head_dim, as in Gemma-2-27B.
    "gemma2": TinyModelSpec("Gemma2Config", "Gemma2ForCausalLM",
                            dict(_GEMMA, num_hidden_layers=4, query_pre_attn_scalar=64, sliding_window=8,
                                 attn_logit_softcapping=2.0, final_logit_softcapping=10.0, rope_theta=10000.0),
                            "gemma2", "gemma2", "gemma2-2b"),
    # 8 layers: one scanned block of 6 (layer 5 global) plus 2 remainder layers; local and global rope bases,
    # linear scaling 8 on global layers (as Gemma-3-4B); query_pre_attn_scalar = head_dim (gemma3-4b's rule).
    # attn_logit_softcapping is set although transformers' Gemma3 ignores it: the conversion must ignore it too.
    "gemma3": TinyModelSpec(
        "Gemma3TextConfig", "Gemma3ForCausalLM",
        dict(_GEMMA, num_hidden_layers=8, query_pre_attn_scalar=48, sliding_window=8, attn_logit_softcapping=1.5,
             final_logit_softcapping=10.0,
             rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
        "gemma3", "gemma3-4b", "gemma3-4b"),
    # Gemma 3 4B's multimodal checkpoint at reduced size: the gemma3 row's decoder (tied, E=256) with a SigLIP tower
    # of 2 layers (hidden 64 in 4 heads of 16, MLP 96) on 64x64 images in 4x4 patches (16 a side: MaxText pools to
    # 256 tokens); a sliding window of 260 > the 256-token image block (MaxText and transformers mask it alike
    # only then).
    "gemma3_mm": TinyModelSpec(
        "Gemma3Config", "Gemma3ForConditionalGeneration",
        dict(text_config=dict(_GEMMA, num_hidden_layers=8, query_pre_attn_scalar=48, sliding_window=260,
                              final_logit_softcapping=10.0,
                              rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                  "rope_theta": 1e6},
                                               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
             vision_config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                image_size=64, patch_size=4, layer_norm_eps=1e-6, vision_use_head=False),
             mm_tokens_per_image=256, tie_word_embeddings=True),
        "gemma3", "gemma3-4b", "gemma3-4b", inputs="gemma3"),
    "qwen3_next": TinyModelSpec("Qwen3NextConfig", "Qwen3NextForCausalLM", _HYBRID, "qwen3_next", "qwen3-next",
                                "qwen3-next-80b-a3b", norms_near_zero=_HYBRID_CENTRED_NORMS),
    "qwen3_5": TinyModelSpec(
        "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM",
        dict(_HYBRID, rope_parameters=dict(_HYBRID["rope_parameters"], mrope_section=[2, 2, 2])),
        "qwen3_5", "qwen3.5", "qwen3.5-35b-a3b", norms_near_zero=_HYBRID_CENTRED_NORMS),
    # Qwen3.5-FP8 for MaxText's native fp8 model: BF16 block scales as the hub repos store them, FP8 kernels kept.
    # Blocks of 32 (the hub's 128 would be one block per tiny weight) that divide every kernel axis, as the hub's
    # dimensions do: head_dim 64, linear-attention heads of 32.
    "qwen3_5_fp8": TinyModelSpec(
        "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM",
        dict(_HYBRID, head_dim=64, linear_key_head_dim=32, linear_value_head_dim=32,
             rope_parameters=dict(_HYBRID["rope_parameters"], mrope_section=[2, 2, 4])),
        "qwen3_5", "qwen3.5", "qwen3.5-35b-a3b-fp8", norms_near_zero=_HYBRID_CENTRED_NORMS,
        fp8=Fp8Shipping("QWEN3_5_FP8_WEIGHTS", (32, 32), "bfloat16"), converter_flags=("--keep_fp8",)),
    # Qwen3-VL-4B's multimodal checkpoint at reduced size (dense, tied): the tower above with deepstack mergers after
    # blocks 0 and 2. MaxText runs deepstack unscanned only.
    "qwen3_vl": TinyModelSpec(
        "Qwen3VLConfig", "Qwen3VLForConditionalGeneration",
        dict(text_config=_QWEN3_VL_TEXT,
             vision_config=dict(_QWEN_VISION, out_hidden_size=64, deepstack_visual_indexes=[0, 2]),
             tie_word_embeddings=True),
        "qwen3_vl", "qwen3-vl-4b", "qwen3-vl-4b", scans=(False,), inputs="qwen_vl", shipped_floor=4.4e-2),
    # Qwen3-VL-30B-A3B at reduced size: untied, 4 experts of 48 (top 2; 2M = 96 != E = 64, so the hub's and
    # transformers' fused layouts differ in shape), saved fused as transformers 5.24 writes them.
    "qwen3_vl_moe": TinyModelSpec(
        "Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration",
        dict(text_config=dict(_QWEN3_VL_TEXT, moe_intermediate_size=48, num_experts=4, num_experts_per_tok=2,
                              decoder_sparse_step=1, mlp_only_layers=[]),
             vision_config=dict(_QWEN_VISION, out_hidden_size=64, deepstack_visual_indexes=[0, 2]),
             tie_word_embeddings=False),
        "qwen3_vl", "qwen3-vl-30b-a3b", "qwen3-vl-30b-a3b", scans=(False,), inputs="qwen_vl", shipped_floor=3.3e-2),
    # Weaver-Mini at reduced size: the qwen3_vl row's model (dense, tied) with three deepstack mergers, as Weaver-Mini
    # has, saved under Weaver's names and config (tools/weaver_checkpoint.py); transformers has no Weaver class, so
    # the references run the Qwen3-VL it was built as.
    "weaver": TinyModelSpec(
        "Qwen3VLConfig", "Qwen3VLForConditionalGeneration",
        dict(text_config=_QWEN3_VL_TEXT,
             vision_config=dict(_QWEN_VISION, out_hidden_size=64, deepstack_visual_indexes=[0, 1, 2]),
             tie_word_embeddings=True),
        "weaver", "weaver-mini", "weaver-mini", scans=(False,), inputs="qwen_vl", shipped_floor=4.4e-2,
        hub_layout=weaver_checkpoint.to_weaver, hub_config=weaver_checkpoint.weaver_config),
    # Qwen3.5-35B-A3B's multimodal checkpoint at reduced size: the qwen3_5 row's hybrid decoder at hidden 64 with the
    # tower above (no deepstack, so the decoder scans).
    "qwen3_5_mm": TinyModelSpec(
        "Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration",
        dict(text_config=dict(_HYBRID, hidden_size=64, vocab_size=248059,
                              rope_parameters=dict(_HYBRID["rope_parameters"], mrope_section=[2, 2, 2])),
             vision_config=dict(_QWEN_VISION, out_hidden_size=64), tie_word_embeddings=False),
        "qwen3_5", "qwen3.5", "qwen3.5-35b-a3b", norms_near_zero=_HYBRID_CENTRED_NORMS, inputs="qwen_vl",
        shipped_floor=1.4e-1),
    # Qwen3-Omni's thinker (no talker: transformers builds the class without it) at reduced size: a Qwen3-MoE decoder
    # of 3 layers (E=64, head_dim 32 != 64/4, 4 experts, interleaved MRoPE [6, 5, 5]) whose vocabulary exceeds the
    # hard-coded placeholder ids (transformers embeds them); a vision tower of 3 blocks (hidden 32 in 2 heads, patch 4,
    # merge 2, a 4x4 position table interpolated to the image's grid) with deepstack mergers after blocks 0 and 1;
    # an audio encoder of 2 layers (d_model 128 in 2 heads of 64, 64 conv channels; narrower, the random attention is
    # near-uniform and swapped q/k projections move the logits by 2e-4 only) on 20 mel bins (3 after the convs:
    # conv_out reads 64 x 3), MaxText's 100-frame chunk (n_window 50) attended as one window (n_window_infer 100, as
    # MaxText attends). The hub's placeholder ids, not transformers' defaults. Unscanned only (deepstack).
    "qwen3_omni": TinyModelSpec(
        "Qwen3OmniMoeConfig", "Qwen3OmniMoeForConditionalGeneration",
        dict(enable_audio_output=False, thinker_config=dict(
            text_config=dict(hidden_size=64, num_hidden_layers=3, vocab_size=151681, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=32, intermediate_size=96, moe_intermediate_size=32,
                             num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, rms_norm_eps=1e-6,
                             max_position_embeddings=512,
                             rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [6, 5, 5],
                                              "interleaved": True}),
            vision_config=dict(depth=3, hidden_size=32, num_heads=2, intermediate_size=48, patch_size=4,
                               temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64,
                               num_position_embeddings=16, deepstack_visual_indexes=[0, 1]),
            audio_config=dict(d_model=128, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=192,
                              num_mel_bins=20, downsample_hidden_size=64, output_dim=64, n_window=50,
                              n_window_infer=100, max_source_positions=200),
            image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
            audio_token_id=151675, audio_start_token_id=151669, audio_end_token_id=151670,
            position_id_per_seconds=13)),
        "qwen3_omni", "qwen3-omni-30b-a3b", "qwen3-omni-30b-a3b", scans=(False,), inputs="qwen_omni",
        shipped_floor=2.7e-2),
    "olmo3": TinyModelSpec("Olmo3Config", "Olmo3ForCausalLM", _OLMO3, "olmo3", "olmo3-7b-pt", "olmo3-7b-pt"),
    "deepseek3": TinyModelSpec("DeepseekV3Config", "DeepseekV3ForCausalLM", _DEEPSEEK, "deepseek", "deepseek3",
                               "deepseek3-671b"),
    # V2-Lite's shape: full-rank queries, softmax routing without bias or groups, 2 shared experts.
    "deepseek2": TinyModelSpec(
        "DeepseekV2Config", "DeepseekV2ForCausalLM",
        dict(_DEEPSEEK, q_lora_rank=None, n_shared_experts=2, routed_scaling_factor=1.0, n_group=None, topk_group=None,
             norm_topk_prob=False, topk_method="greedy",
             rope_parameters=dict(_DEEPSEEK["rope_parameters"], mscale=0.707, mscale_all_dim=0.707)),
        "deepseek", "deepseek2", "deepseek2-16b"),
    # The sparse indexer keeps 4 of the 32 test tokens; 32 indexer heads avoid ties at ReLU's 0 (contract pitfall 10).
    "deepseek3.2": TinyModelSpec("DeepseekV32Config", "DeepseekV32ForCausalLM",
                                 dict(_DEEPSEEK, index_n_heads=32, index_head_dim=32, index_topk=4),
                                 "deepseek", "deepseek3.2", "deepseek3.2-671b"),
    "kimi_k2": TinyModelSpec("DeepseekV3Config", "DeepseekV3ForCausalLM", _KIMI, "deepseek", "kimi-k2-1t", "kimi-k2-1t",
                             hub_layout=kimi_hub_layout, hub_config=kimi_hub_config, fp8=_KIMI_INT4),
    "kimi_k25": TinyModelSpec("Kimi_K25Config", "Kimi_K25ForConditionalGeneration",
                              dict(text_config=dict(_KIMI, num_attention_heads=7, num_key_value_heads=7),
                                   vision_config=_KIMI_VISION, projection_hidden_size=32, tie_word_embeddings=False),
                              "kimi_k25", "kimi-k2-1t", "kimi-k2-1t", hub_layout=kimi_hub_layout,
                              hub_config=kimi_hub_config, fp8=_KIMI_INT4),
    "gpt_oss": TinyModelSpec("GptOssConfig", "GptOssForCausalLM", _GPT_OSS, "gpt_oss", "gpt-oss", "gpt-oss-20b"),
    "deepseek4": TinyModelSpec("DeepseekV4Config", "DeepseekV4ForCausalLM", _DEEPSEEK4, "deepseek4", "deepseek4-284b",
                               "deepseek4-284b", hub_layout=deepseek4_hub_layout, hub_config=deepseek4_hub_config,
                               seq_len=256, unit_scale=_DEEPSEEK4_UNIT_SCALE),
    # Scout-like: every layer MoE, q/k L2 norms, MaxText's llama3 rope scaling.
    "llama4_16e": TinyModelSpec(
        "Llama4TextConfig", "Llama4ForCausalLM",
        dict(_LLAMA4, interleave_moe_layer_step=1, use_qk_norm=True,
             rope_parameters=dict(_LLAMA31_SCALING, rope_theta=500000.0)),
        "llama4", "llama4-17b-16e", "llama4-17b-16e"),
    # Maverick-like: dense and MoE layers in turn, no q/k norms, plain rope.
    "llama4_128e": TinyModelSpec(
        "Llama4TextConfig", "Llama4ForCausalLM",
        dict(_LLAMA4, interleave_moe_layer_step=2, use_qk_norm=False,
             rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
        "llama4", "llama4-17b-128e", "llama4-17b-128e"),
    # Llama 4 Scout's multimodal checkpoint at reduced size: the llama4_16e row's decoder with a vocabulary past the
    # <|patch|> id 200092 (transformers looks every id up; MaxText clamps them); a vision tower of 2 layers (hidden
    # 64 in 4 heads of 16; 64 != 3 p^2 = 48, so a transposed patch kernel cannot keep its shape) on 32x32 tiles in
    # 4x4 patches (8 a side), pixel shuffle 0.5 (the shuffle MLP reads 64 / 0.5^2 = 256 = the encoder's MLP width),
    # adapter 96 -> 96, 16 soft tokens per tile; a vision rope base that is not MaxText's default.
    "llama4_mm": TinyModelSpec(
        "Llama4Config", "Llama4ForConditionalGeneration",
        dict(text_config=dict(_LLAMA4, vocab_size=200093, interleave_moe_layer_step=1, use_qk_norm=True,
                              rope_parameters=dict(_LLAMA31_SCALING, rope_theta=500000.0)),
             vision_config=dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=256,
                                image_size=32, patch_size=4, pixel_shuffle_ratio=0.5, projector_input_dim=96,
                                projector_output_dim=96, vision_output_dim=96, norm_eps=1e-5,
                                rope_parameters={"rope_type": "default", "rope_theta": 5000.0}),
             tie_word_embeddings=False),
        "llama4", "llama4-17b-16e", "llama4-17b-16e", inputs="llama4", shipped_floor=4.7e-5),
    # 26B-A4B-like: every layer MoE (8 experts of 64, top 2, beside a shared expert of 160), global layers with one
    # KV head whose values are its keys (attention_k_eq_v).
    "gemma4_moe": TinyModelSpec(
        "Gemma4TextConfig", "Gemma4ForCausalLM",
        dict(_GEMMA4, enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=64,
             intermediate_size=160, attention_k_eq_v=True, num_global_key_value_heads=1),
        "gemma4", "gemma4-26b", "gemma4-26b", norms_near_zero=_GEMMA4_QK_NORMS),
    # Gemma 4 26B-A4B's multimodal checkpoint at reduced size: the gemma4_moe row's decoder, its sliding window 300 >
    # the 280-token image block (image tokens attend each other in sliding layers, use_bidirectional_attention
    # "vision"; MaxText and transformers mask alike only then); a vision tower of 2 layers (hidden 64 in 4 heads of
    # 16, MLP 96, no clipping, standardized soft tokens) on MaxText's 672x960 images in 16x16 patches (42 x 60, not
    # square, so swapped x/y tables show), position tables of 72 rows (!= the hidden size), a vision rope base that
    # is not MaxText's default. Its q/k norms are drawn around 0 too (the tower attends unscaled as well).
    "gemma4_mm": TinyModelSpec(
        "Gemma4Config", "Gemma4ForConditionalGeneration",
        dict(text_config=dict(_GEMMA4, enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=64,
                              intermediate_size=160, attention_k_eq_v=True, num_global_key_value_heads=1,
                              sliding_window=300, use_bidirectional_attention="vision"),
             vision_config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=4, head_dim=16, patch_size=16, position_embedding_size=72,
                                pooling_kernel_size=3, standardize=True, use_clipped_linears=False, rms_norm_eps=1e-6,
                                rope_parameters={"rope_type": "axial", "rope_theta": 250.0}),
             audio_config=None, tie_word_embeddings=True),
        "gemma4", "gemma4-26b", "gemma4-26b", norms_near_zero=_GEMMA4_QK_NORMS, inputs="gemma4",
        shipped_floor=3.7e-2,
        # tools/forward.py's text logits against transformers': 1.38e-4 on an AMD EPYC host (the same on every run,
        # cosine 0.9999999996, argmax 100%), under 1e-4 on Intel Xeon ones; MaxText's own forward of this tiny
        # model, 2.5e-5 (the interop step). A wrong layout moves them by 1e-2 and more.
        logits_atol=2e-4),
    # 31B-like but with value projections on the global layers (attention_k_eq_v false).
    "gemma4_dense": TinyModelSpec("Gemma4TextConfig", "Gemma4ForCausalLM", _GEMMA4, "gemma4", "gemma4-31b",
                                  "gemma4-31b", norms_near_zero=_GEMMA4_QK_NORMS),
    # E2B-like: 10 layers of 4 sliding + 1 global, one KV head; per-layer inputs of 32 from a table of 512 rows (!=
    # vocab); the last 4 layers reuse layer 5's (sliding) or layer 4's (global) keys and values, with MLPs twice as
    # wide. MaxText has no scanned form.
    "gemma4_e2b": TinyModelSpec(
        "Gemma4TextConfig", "Gemma4ForCausalLM",
        dict(_GEMMA4, num_hidden_layers=10, num_key_value_heads=1, intermediate_size=128,
             layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 2, num_kv_shared_layers=4,
             use_double_wide_mlp=True, hidden_size_per_layer_input=32, vocab_size_per_layer_input=512),
        "gemma4_small", "gemma4-e2b", "gemma4-e2b", scans=(False,), norms_near_zero=_GEMMA4_QK_NORMS),
    # E4B-like: 12 layers of 5 sliding + 1 global; the last 4 reuse layer 7's or layer 5's keys and values.
    "gemma4_e4b": TinyModelSpec(
        "Gemma4TextConfig", "Gemma4ForCausalLM",
        dict(_GEMMA4, intermediate_size=128, num_kv_shared_layers=4, hidden_size_per_layer_input=32,
             vocab_size_per_layer_input=512),
        "gemma4_small", "gemma4-e4b", "gemma4-e4b", scans=(False,), norms_near_zero=_GEMMA4_QK_NORMS),
}
# DeepSeek-V4-Flash as the hub ships it: FP8 with power-of-two E8M0 `.scale` grids in 48x40 blocks (partial last
# blocks on nearly every axis: 256, 48, 64, 96, 128 against 48 and 40), routed experts packed FP4 (two e2m1 values
# per I8 byte, a scale per 32), the hub's BF16 and F32 tensors as it stores them.
TINY_MODELS["deepseek4_fp8"] = dataclasses.replace(
    TINY_MODELS["deepseek4"], fp8=Fp8Shipping("DEEPSEEK4_FP8_WEIGHTS", (48, 40), "float8_e8m0fnu",
                                              quantizer="quantize_deepseek4"))


def config_json(name: str) -> dict[str, Any]:
  """The tiny model's config.json exactly as `save_pretrained` writes it, without building any weights."""
  import json  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  spec = TINY_MODELS[name]
  config = getattr(transformers, spec.config_class)(**spec.config)
  if spec.hub_config:  # The full config: the hub's keys derive from fields a diff would leave out.
    return spec.hub_config(dict(json.loads(config.to_json_string(use_diff=False)), architectures=[spec.model_class]))
  return dict(json.loads(config.to_json_string(use_diff=True)), architectures=[spec.model_class])


def randomize_parameters(model: Any, seed: int, norms_near_zero: str = "", unit_scale: str = "") -> None:
  """Weights ~ N(0, 0.05^2); 1-D norm scales ~ 1 + N(0, 0.2^2), or N(0, 0.2^2) for those `norms_near_zero`
  matches; those `unit_scale` matches ~ N(0, 1); DeepSeek's routing bias ~ N(0, 0.3^2), large enough to change
  which experts are chosen. Saved buffers are randomized like parameters; DeepSeek V4's hash table `tid2eid` holds
  distinct random experts per token."""
  import re  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  generator = torch.Generator().manual_seed(seed)
  tensors = dict(model.named_parameters())
  tables = {}
  for module_name, module in model.named_modules():
    saved = set(module.state_dict(keep_vars=True))  # Persistent buffers only, not rotary caches.
    for name, buffer in module.named_buffers(recurse=False):
      if name in saved and buffer.is_floating_point():
        tensors[f"{module_name}.{name}" if module_name else name] = buffer
      elif name == "tid2eid":  # DeepSeek V4's hash routing: k distinct experts per token id.
        tables[f"{module_name}.{name}"] = buffer
  with torch.no_grad():
    for name, table in sorted(tables.items()):
      experts = model.config.n_routed_experts
      order = torch.argsort(torch.rand(table.shape[0], experts, generator=generator), dim=1)
      table.copy_(order[:, : table.shape[1]])
    for name, tensor in sorted(tensors.items()):
      noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float32)
      if name.endswith("e_score_correction_bias"):
        tensor.copy_(0.3 * noise)
      elif norms_near_zero and re.match(norms_near_zero, name):
        tensor.copy_(0.2 * noise)
      elif unit_scale and re.match(unit_scale, name):
        tensor.copy_(noise)
      elif tensor.ndim == 1 and "norm" in name:
        tensor.copy_(1.0 + 0.2 * noise)
      else:
        tensor.copy_(0.05 * noise)


def build_tiny_model(
    family: str, output_dir: str, *, dtype: str = "float32", seed: int = 0, max_shard_size: str | None = None,
    round_embeddings_to_bf16: bool = False, **config_overrides: Any,
) -> str:
  """Writes a random tiny `family` model (config.json + safetensors) to `output_dir`; returns it.

  `round_embeddings_to_bf16` rounds the input and output embedding tables to bfloat16-representable values
  (still saved in `dtype`): MaxText computes tied logits with a bfloat16 copy of the table whatever its dtype."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  spec = TINY_MODELS[family]
  config = getattr(transformers, spec.config_class)(**{**spec.config, **config_overrides})
  torch.manual_seed(seed)
  model = getattr(transformers, spec.model_class)(config).to(torch.float32)
  randomize_parameters(model, seed, spec.norms_near_zero, spec.unit_scale)
  if round_embeddings_to_bf16:
    with torch.no_grad():
      for table in (model.get_input_embeddings(), model.get_output_embeddings()):
        if table is not None:
          table.weight.copy_(table.weight.to(torch.bfloat16).to(torch.float32))
  model = model.to(getattr(torch, dtype))
  kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
  if spec.fp8 is None:
    model.save_pretrained(output_dir, **kwargs)
    if spec.hub_layout:
      spec.hub_layout(output_dir)
    return output_dir
  import tempfile  # pylint: disable=g-import-not-at-top
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tools import quantize  # pylint: disable=g-import-not-at-top

  with tempfile.TemporaryDirectory() as plain:
    model.save_pretrained(plain, **kwargs)
    if spec.hub_layout:
      spec.hub_layout(plain)
    scale_dtype = np.dtype(getattr(ml_dtypes, spec.fp8.scale_dtype, spec.fp8.scale_dtype))
    return getattr(quantize, spec.fp8.quantizer)(plain, output_dir, spec.fp8.block,
                                                 getattr(quantize, spec.fp8.weights).match, scale_dtype)
