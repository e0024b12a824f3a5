"""The MaxText config overrides that make a MaxText model match the converted checkpoint.

MaxText's model configs carry their own dimensions and rope theta; a user running a checkpoint whose values
differ must override them, so the converter prints (and records) the exact set.
"""

from __future__ import annotations

from typing import Any

from converter.plan import Plan


def maxtext_overrides(plan: Plan) -> dict[str, Any]:
  cfg = plan.config
  overrides: dict[str, Any] = {
      "base_emb_dim": cfg.hidden_size,
      "base_num_query_heads": cfg.num_heads,
      "base_num_kv_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim,
      "base_mlp_dim": cfg.intermediate_size,
      "base_num_decoder_layers": cfg.num_layers,
      "vocab_size": plan.target_vocab_size,
      "normalization_layer_epsilon": cfg.rms_norm_eps,
      "rope_max_timescale": cfg.rope_theta,
      "logits_via_embedding": cfg.tie_word_embeddings,
      "scan_layers": plan.scan_layers,
  }
  if cfg.tie_word_embeddings:
    # MaxText divides tied logits by sqrt(emb_dim) by default, which only Gemma's baked sqrt(E) expects.
    overrides["normalize_embedding_logits"] = False
  overrides.update(plan.family.extra_overrides(cfg) if plan.family.extra_overrides else {})
  return overrides
