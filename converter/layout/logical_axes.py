"""MaxText's logical axis names for every leaf we write: which axes its `logical_axis_rules` shard, and so where the
stored chunks are cut (converter/layout/chunking.py).

Model facts, read off MaxText 0.2.5's own modules (each parameter's `out_sharding`) and checked against them for
every family and scan setting by the interop step (integration_tests/maxtext_interop/maxtext_logits.py compares
the axes a conversion records with MaxText's). MaxText names a leaf's axes by what the leaf is, whatever the
family: a query kernel is (embed_attn, q_heads, kv) in every decoder and tower; so one table keyed by the leaf's
path serves every family. A stacked leaf has its layer axes (`layers`; `layers`, `local_layers` for blocks of
layers; DeepSeek's `dense_layers` / `moe_layers`) at the scan axis. Leaves MaxText leaves unannotated (most tower
leaves, convolutions, gated-delta-net scalars, the hybrid decoders' norms) have None instead of axes: replicated.
"""

from __future__ import annotations

import re

Axes = tuple[str | None, ...]
UNANNOTATED: Axes = ()  # A rule's axes for leaves MaxText gives no logical axes.

# (regex on the leaf's path without its layer-group prefix, rank of one layer's value, axes), first match wins.
_RULES: tuple[tuple[str, int, Axes], ...] = (
    (r"(^|/)token_embedder/embedding$", 2, ("vocab", "embed_vocab")),
    (r"per_layer_embedder/embed_tokens_per_layer$", 2, ("vocab", "embed_vocab")),
    (r"(^|/)logits_dense/kernel$", 2, ("embed_vocab", "vocab")),
    (r"per_layer_embedder/per_layer_model_projection/kernel$", 2, ("embed", "mlp")),
    # DeepSeek V4: mHC mixers (their betas and scales are annotated, unnamed), compressed attention and its
    # indexer, the grouped output projection (its wq_a is named by the family: q_lora, not V3's q_lora_up_proj).
    (r"(^|/)hc_head/hc_fn$", 2, ("activation_embed", None)),
    (r"mhc_(attention|mlp)/(pre|post|res)_alpha$", 2, ("activation_embed", None)),
    (r"mhc_(attention|mlp)/((pre|post)_beta|(pre|post|res)_alpha_scale)$", 1, (None,)),
    (r"mhc_(attention|mlp)/res_beta$", 2, (None, None)),
    (r"(csa|hca)_compressor/(indexer/)?(kv_proj|gate_proj)/kernel$", 2, ("embed_attn", "kv")),
    (r"csa_compressor/indexer/q_proj/kernel$", 2, ("q_lora", "indexer_q")),
    (r"csa_compressor/indexer/weights_proj/kernel$", 2, ("embed_attn", "indexer_weights")),
    (r"self_attention/o_a_proj/kernel$", 3, ("o_groups", "q_heads", "o_lora_up_proj")),
    (r"self_attention/o_b_proj/kernel$", 2, ("o_lora_up_proj", "embed_attn")),
    (r"self_attention/wkv/kernel$", 3, ("embed_attn", "kv_heads", "kv_head_dim")),
    # Multi-head latent attention (DeepSeek) and its indexer.
    (r"wq_a/kernel$", 2, ("embed_attn", "q_lora_up_proj")),
    (r"wkv_a/kernel$", 2, ("embed_attn", "kv_lora_up_proj")),
    (r"wq_b/kernel$", 3, ("q_lora", "q_heads", "kv")),
    (r"wkv_b/kernel$", 3, ("kv_lora", "kv_heads", "kv_head_dim")),
    (r"indexer/wk/kernel$", 2, ("embed_attn", "kv")),
    (r"indexer/weights_proj/kernel$", 2, ("embed_attn", "q_heads")),
    (r"indexer/k_norm/(scale|bias)$", -1, UNANNOTATED),
    # Attention projections, in decoders and towers alike.
    (r"/query/kernel$", 3, ("embed_attn", "q_heads", "kv")),
    (r"/(key|value)/kernel$", 3, ("embed_attn", "kv_heads", "kv_head_dim")),
    (r"/query/bias$", 2, ("q_heads", "kv")),
    (r"/(key|value)/bias$", 2, ("kv_heads", "kv_head_dim")),
    (r"/out/kernel$", 3, ("heads", "kv", "embed_attn")),
    (r"attention/out/kernel$", 2, ("mlp", "embed_attn")),  # Qwen3.5's gated full attention output.
    (r"/out/bias$", 1, ("embed_attn",)),
    (r"/sinks$", 1, (None,)),
    # Gated delta net (Qwen3-Next, Qwen3.5).
    (r"in_proj_(qkvz|ba)/kernel$", 2, ("embed_attn", "gdn_head")),
    (r"out_proj/kernel$", 2, ("gdn_head", "embed_attn")),
    # Experts and routers.
    (r"/(wi_\d+|wi)$", 3, ("exp", "embed_moe", "mlp_moe")),
    (r"/wo$", 3, ("exp", "mlp_moe", "embed_moe")),
    (r"/wi_\d+_bias$", 2, ("exp", "activation_mlp")),
    (r"/wo_bias$", 2, ("exp", "activation_embed")),
    (r"/per_expert_scale$", 1, ("exp",)),
    (r"per_layer_input_gate/kernel$", 2, ("embed", "mlp")),
    (r"(Block_\d+|moe_block|(^|/)mlp)/MoeBlock_\d+/gate/kernel$", 2, ("embed_router", None)),
    (r"gate/kernel$", 2, ("embed", None)),
    (r"gate/bias$", 1, (None,)),
    # Dense MLPs (decoders, shared experts, Gemma 4's per-layer inputs, the Gemma 4 projector, the audio tower).
    (r"(^|/)(mlp|mlp_local|mlp_global|shared_experts?|AudioMLP)/(wi_\d+|wi)/kernel$", 2, ("embed", "mlp")),
    (r"(^|/)(mlp|mlp_local|mlp_global|shared_experts?|AudioMLP)/wo/kernel$", 2, ("mlp", "embed")),
    (r"AudioMLP/wi/bias$", 1, ("mlp",)),
    (r"AudioMLP/wo/bias$", 1, ("embed",)),
    (r"per_layer_projection/kernel$", 2, ("mlp", "embed")),
    (r"Gemma4VisionProjector_\d+/projection/kernel$", 2, ("embed", "mlp")),
    (r"pre_forward_scale_\d+$", 1, ("embed",)),
    (r"layer_scalar$", 1, (None,)),
    (r"std_(bias|scale)$", 1, (None,)),
    # Norm scales of the decoders, Gemma's projector and Gemma 4's tower; the other towers' norms are unannotated.
    (r"^(vision_encoder|audio_encoder)/(?!Gemma4VisionEncoderLayer_|VisionEmbedder_).*/(scale|bias)$", -1,
     UNANNOTATED),
    # The hybrid decoders' (Qwen3-Next, Qwen3.5) norms are unannotated too.
    (r"(^|/)(input_layernorm|post_attention_layernorm|norm/rms_norm|attention/attention/(query|key)_norm)/scale$", -1,
     UNANNOTATED),
    (r"(norm|layernorm|layer_norm)[^/]*/scale$", 1, ("norm",)),
)


def per_layer(path: str, rank: int) -> Axes | None:
  """One layer's (or a top-level leaf's) logical axes for the leaf at `path` (its MaxText path below the layer
  group for layer leaves); None where MaxText annotates none."""
  for pattern, rule_rank, axes in _RULES:
    if re.search(pattern, path) and rule_rank in (rank, -1):
      return axes or None
  return None


def stacked(axes: Axes | None, scan_axis: int, stacking: tuple[str, ...]) -> Axes | None:
  """A stacked leaf's axes: one layer's, with the layer axes `stacking` inserted at `scan_axis`."""
  return None if axes is None else axes[:scan_axis] + stacking + axes[scan_axis:]
