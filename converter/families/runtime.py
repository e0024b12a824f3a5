"""What MaxText computes at run time for a converted checkpoint: its config values and its decoder's fixed rules.

One object, read by two consumers: `MaxTextConfig.overrides()` is what the converter prints and records for the
user (the `key=value` pairs MaxText needs on top of its model yml), and the reference forward pass
(tools/forward.py) computes logits from the same fields. A family that forgets an override therefore fails the
validator's logits comparison, not only the MaxText interop check.

`MaxTextConfig` fields are named exactly as MaxText's config keys; None means "not set: MaxText's model config
decides" and is not emitted. `Decoder` holds what MaxText's decoder for the target does whatever the config says
(norm names, hard-coded epsilons, layer patterns, which routing the model name selects).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class MaxTextConfig:
  """MaxText config keys the checkpoint needs; every non-None field is an override."""

  base_emb_dim: int
  base_num_query_heads: int
  base_num_kv_heads: int
  base_mlp_dim: int
  base_num_decoder_layers: int
  vocab_size: int
  normalization_layer_epsilon: float
  rope_max_timescale: float
  logits_via_embedding: bool
  head_dim: int | None = None  # None for multi-head latent attention, whose head sizes are its own keys.
  scan_layers: bool | None = None  # Set by the plan.
  normalize_embedding_logits: bool | None = None
  # Attention.
  attention_bias: bool | None = None
  use_qk_norm: bool | None = None
  sliding_window_size: int | None = None
  attn_logits_soft_cap: float | None = None
  final_logits_soft_cap: float | None = None
  chunk_attn_window_size: int | None = None
  nope_layer_interval: int | None = None
  temperature_tuning: bool | None = None
  # Rotary embeddings.
  rope_use_scale: bool | None = None
  local_rope_max_timescale: float | None = None
  rope_linear_scaling_factor: float | None = None
  rope_factor: int | None = None
  original_max_position_embeddings: int | None = None
  max_position_embeddings: int | None = None
  beta_fast: int | None = None
  beta_slow: int | None = None
  mscale: float | None = None
  rope_interleave: bool | None = None
  rope_truncate: bool | None = None
  rope_attention_scaling: bool | None = None
  rope_type: str | None = None  # "default" or "yarn" where the model config allows both (OLMo 3).
  partial_rotary_factor: float | None = None  # Rotary on the first fraction of each head (Qwen3-Next, Qwen3.5).
  use_mrope: bool | None = None
  mrope_section: tuple[int, ...] | None = None
  # Mixture of experts.
  num_experts: int | None = None
  num_experts_per_tok: int | None = None
  base_moe_mlp_dim: int | None = None
  norm_topk_prob: bool | None = None
  shared_experts: int | None = None
  first_num_dense_layers: int | None = None
  interleave_moe_layer_step: int | None = None
  inhomogeneous_layer_cycle_interval: int | None = None  # Scanned blocks of this many layers (GPT-OSS, Llama 4).
  routed_scaling_factor: float | None = None
  routed_score_func: str | None = None
  routed_bias: bool | None = None
  n_routing_groups: int | None = None
  topk_routing_group: int | None = None
  mlp_activations_limit: float | None = None
  # Multi-head latent attention (DeepSeek) and its sparse indexer (V3.2).
  q_lora_rank: int | None = None
  kv_lora_rank: int | None = None
  qk_nope_head_dim: int | None = None
  qk_rope_head_dim: int | None = None
  v_head_dim: int | None = None
  use_indexer: bool | None = None
  indexer_n_heads: int | None = None
  indexer_head_dim: int | None = None
  indexer_topk: int | None = None
  # DeepSeek V4: grouped low-rank output projection, mHC streams, hash-routed first layers, compressed attention.
  o_groups: int | None = None
  o_lora_rank: int | None = None
  mhc_expansion_rate: int | None = None
  sinkhorn_iterations: int | None = None
  first_num_hash_layers: int | None = None
  compress_ratios: tuple[int, ...] | None = None
  compressed_rope_max_timescale: float | None = None
  use_multimodal: bool | None = None
  use_audio: bool | None = None
  # The towers' keys (`*_for_vit`, `*_for_audio`, ...: converter/families/base.Towers), emitted after the rest.
  towers: tuple[tuple[str, Any], ...] | None = None
  # Native fp8 models (--keep_fp8): FP8 kernels with block scales, the modules MaxText keeps in `dtype`.
  weight_dtype: str | None = None
  weight_block_size: int | None = None
  unquantized_modules: tuple[str, ...] | None = None
  # Gated delta net (the linear-attention layers of Qwen3-Next and Qwen3.5).
  gdn_conv_kernel_dim: int | None = None
  gdn_key_head_dim: int | None = None
  gdn_value_head_dim: int | None = None
  gdn_num_key_heads: int | None = None
  gdn_num_value_heads: int | None = None
  # Gemma 4.
  global_head_dim: int | None = None  # Head size and KV heads of the global (full-attention) layers.
  global_num_kv_heads: int | None = None
  share_kv_projections: bool | None = None  # Global layers' values are their raw keys (HF attention_k_eq_v).
  global_rope_max_timescale: float | None = None
  global_rope_proportion: float | None = None  # Fraction of each head the rotary embedding turns.
  local_rope_proportion: float | None = None
  hidden_size_per_layer_input: int | None = None  # Per-layer embeddings (gemma4_small).
  vocab_size_per_layer_input: int | None = None
  num_kv_shared_layers: int | None = None  # The last layers reuse the keys and values of an earlier one.
  use_double_wide_mlp: bool | None = None  # KV-shared layers have MLPs twice as wide.

  @classmethod
  def from_overrides(cls, overrides: dict[str, Any]) -> MaxTextConfig:
    """The config whose `overrides()` are `overrides` (as recorded): keys that are not fields are the towers'."""
    names = {f.name for f in dataclasses.fields(cls)} - {"towers"}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()}  # JSON keeps tuples as lists.
    towers = tuple((k, v) for k, v in values.items() if k not in names)
    return cls(**{k: v for k, v in values.items() if k in names}, towers=towers or None)

  def overrides(self) -> dict[str, Any]:
    """The `key=value` pairs a user passes to MaxText, in declaration order."""
    values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}
    towers = dict(values.pop("towers", ()))
    return {**values, **towers}


@dataclasses.dataclass(frozen=True)
class Decoder:
  """What MaxText's decoder for the target fixes whatever its config says."""

  # Attention: the factor on q.k applied at run time (None: head_dim**-0.5; 1.0 where the converter bakes the
  # scale into the query kernel), query/key norms ("rms" per head; "global" over all heads, OLMo 3; "l2" without a
  # scale, Llama 4), attention type.
  query_scale: float | None = None
  qk_norm: str = ""
  attention: str = "mha"  # "mha" or "mla" (DeepSeek's multi-head latent attention).
  attention_block: str = "self_attention"  # The attention's subtree under a layer.
  attention_sinks: bool = False
  # Rotary embedding: "default" (rotate-half), "llama3.1" (interleaved pairs, llama3 scaling when rope_use_scale)
  # or "yarn" (DeepSeek, GPT-OSS; interleaved pairs when rope_interleave).
  rope: str = "default"
  # Norms: leaf names of the norms before attention and before the MLP, and of the optional norms on their outputs.
  pre_attention_norm: str = "pre_self_attention_layer_norm"
  pre_mlp_norm: str = "post_self_attention_layer_norm"
  post_attention_norm: str = ""
  post_mlp_norm: str = ""
  layer_norm_epsilon: float | None = None  # Fixed by the decoder (Gemma: 1e-6); None: normalization_layer_epsilon.
  norm_offset: float = 0.0  # Added to stored norm scales at run time (Qwen3-Next's zero-centred norms: 1).
  # MLP: "silu" or "gelu_tanh" (MaxText's "gelu" is jax.nn.gelu, the tanh approximation); "clamped_swiglu" is
  # GPT-OSS's (sigmoid-weighted gate with alpha 1.702, clamped at mlp_activations_limit, up + 1).
  mlp_activation: str = "silu"
  # Experts: "" (dense), "softmax" (top-k of the logits, softmax over them), "deepseek" (the routing the model name
  # selects: scores, bias and groups for deepseek3*, plain top-k of the scores for deepseek2*), "gpt_oss" (biased
  # logits, softmax over the top k) or "llama4" (sigmoid of the top-k logits scales the expert's input).
  routing: str = ""
  moe_block: str = ""  # The experts' subtree under a layer ("moe_block", "MoeBlock_0", ...).
  # Layers: local (sliding-window) layers repeat this pattern over HF layers; several HF layers per MaxText layer
  # carry these suffixes (Gemma 2); layers that are not MoE are dense (DeepSeek's first layers, Llama 4 128E).
  local_layers: tuple[bool, ...] = ()
  sublayer_suffixes: tuple[str, ...] = ("",)
  # A decoder whose layers share state across layers (KV sharing, per-layer inputs) has its own reference forward
  # pass: `tools/forward_<forward>.py`'s `logits(params, token_ids, runtime, layout)`.
  forward: str = ""

  def is_local(self, hf_layer: int) -> bool:
    return bool(self.local_layers) and self.local_layers[hf_layer % len(self.local_layers)]


@dataclasses.dataclass(frozen=True)
class Runtime:
  config: MaxTextConfig
  decoder: Decoder

  def replace_config(self, **changes: Any) -> Runtime:
    return dataclasses.replace(self, config=dataclasses.replace(self.config, **changes))
