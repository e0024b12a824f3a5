"""Gemma 3 (`Gemma3ForCausalLM`, and `Gemma3ForConditionalGeneration` with its SigLIP vision tower and projector:
converter/families/towers/siglip.py) text decoder: Gemma 2's norms (w + 1) and final soft cap, q/k norms (w + 1), five sliding-window layers then
one global, local and global rope bases, linear rope scaling on global layers only, query scale at run time chosen
by the MaxText model name. transformers' Gemma3 never applies `attn_logit_softcapping`, so MaxText's is turned off.
Scanned, MaxText stacks blocks of 6 layers (`decoder/layers/layers_{j}`) and keeps the remainder unscanned
(`decoder/layers_remainder/layers_{k}`).
"""

import math

from converter.errors import ConversionError
from converter.families import common
from converter.families.base import Family, Layout, Towers
from converter.families.towers import siglip
from converter.families.runtime import Decoder, Runtime
from converter.model_config import ModelConfig

MULTIMODAL = "Gemma3ForConditionalGeneration"
TEXT = "language_model.model."  # The text model's tensors in the multimodal checkpoint, as the hub stores them.
# transformers 5.24's `save_pretrained` writes the tower without `vision_model.`; its in-memory names (and some
# re-exports) put everything under `model.`.
ALIASES = ((r"^model\.language_model\.", TEXT), (r"^model\.vision_tower\.(vision_model\.)?", "vision_tower.vision_model."),
           (r"^vision_tower\.(?!vision_model\.)", "vision_tower.vision_model."),
           (r"^model\.multi_modal_projector\.", "multi_modal_projector."))
PATTERN = (True,) * 5 + (False,)  # MaxText's GEMMA3_ATTENTION_PATTERN: layer_id % 6 == 5 is global.
# MaxText 0.2.5's gemma3.get_query_pre_attn_scalar: by model name, ValueError for any other name.
HEAD_DIM_SCALED = ("gemma3-4b", "gemma3-12b")
EMBED_PER_HEAD_SCALED = ("gemma3-27b",)


def rope(cfg: ModelConfig) -> tuple[float, float, dict, dict]:
  """(global theta, local theta, global scaling, local scaling) from transformers 5's per-layer-type
  `rope_parameters` or transformers 4's rope_theta / rope_local_base_freq / rope_scaling."""
  params = cfg.get("rope_parameters") or {}
  if "full_attention" in params or "sliding_attention" in params:
    full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
    return float(full.get("rope_theta", 1e6)), float(local.get("rope_theta", 1e4)), full, local
  global_theta, local_theta = float(cfg.get("rope_theta") or 1e6), float(cfg.get("rope_local_base_freq") or 1e4)
  return global_theta, local_theta, cfg.get("rope_scaling") or {}, {}


def linear_factor(cfg: ModelConfig) -> float:
  _, _, full, _ = rope(cfg)
  return float(full.get("factor", 1.0)) if common.rope_kind(full) == "linear" else 1.0


def query_scale(cfg: ModelConfig, target: str) -> float:
  if target in EMBED_PER_HEAD_SCALED:
    return (cfg.hidden_size // cfg.num_heads) ** -0.5
  return cfg.head_dim**-0.5


def _infer_target(cfg: ModelConfig) -> str:
  scalar = cfg.get("query_pre_attn_scalar", cfg.head_dim)
  if scalar != cfg.head_dim and scalar == cfg.hidden_size // cfg.num_heads:
    return "gemma3-27b"
  return "gemma3-4b"


def _decoder(cfg: ModelConfig, target: str) -> Decoder:
  return Decoder(
      query_scale=query_scale(cfg, target), qk_norm="rms", pre_attention_norm="pre_self_attention_norm",
      pre_mlp_norm="pre_ffw_norm", post_attention_norm="post_self_attention_norm", post_mlp_norm="post_ffw_norm",
      layer_norm_epsilon=1e-6, mlp_activation="gelu_tanh", local_layers=PATTERN,
  )


def _layout(cfg: ModelConfig, target: str, target_vocab: int, scan_layers: bool) -> Layout:
  rules = common.gemma_rules(cfg, query_scale=None)
  layer = common.sandwich_layer(cfg, rules, _decoder(cfg, target), qk_norm=True)
  layout = Layout(common.embeddings(cfg, target_vocab, rules),
                  common.block_layer_groups(layer, len(PATTERN), cfg.num_layers, scan_layers))
  return layout.under(TEXT) if cfg.architecture == MULTIMODAL else layout


def _towers(cfg: ModelConfig, target: str) -> Towers | None:
  if cfg.architecture != MULTIMODAL:
    return None
  return siglip.towers(cfg, tower="vision_tower.vision_model", projector="multi_modal_projector")


def _runtime(cfg: ModelConfig, target: str) -> Runtime:
  global_theta, local_theta, _, _ = rope(cfg)
  return common.runtime(
      cfg, _decoder(cfg, target), normalize_embedding_logits=True, sliding_window_size=cfg.require("sliding_window"),
      attn_logits_soft_cap=0.0,  # transformers' Gemma3 never applies attn_logit_softcapping; MaxText would.
      final_logits_soft_cap=0.0 if cfg.architecture == MULTIMODAL else common.soft_cap(cfg.get("final_logit_softcapping")),
      rope_max_timescale=global_theta,
      local_rope_max_timescale=local_theta, rope_linear_scaling_factor=linear_factor(cfg))


def _check(cfg: ModelConfig, target: str) -> list[str]:
  """Refuses what MaxText cannot run as HF does: an unknown model name (MaxText raises), or a query scale the name
  does not give. (Folding the ratio into the stored q_norm scale would be exact in real arithmetic, but the
  checkpoint would no longer hold HF's weights; refusing keeps every converted tensor HF's.)"""
  if target not in HEAD_DIM_SCALED + EMBED_PER_HEAD_SCALED:
    raise ConversionError(f"--target_model={target}: MaxText 0.2.5 sets Gemma 3's query scale by model name and"
                          f" knows only {', '.join(HEAD_DIM_SCALED + EMBED_PER_HEAD_SCALED)}")
  scalar = cfg.get("query_pre_attn_scalar", cfg.head_dim)
  expected = query_scale(cfg, target)
  if not math.isclose(float(scalar) ** -0.5, expected, rel_tol=1e-12):
    per_head = cfg.hidden_size // cfg.num_heads
    fitting = "gemma3-27b" if scalar == per_head else "gemma3-4b or gemma3-12b" if scalar == cfg.head_dim else ""
    raise ConversionError(
        f"{cfg.path}: query_pre_attn_scalar={scalar}, but MaxText's {target} scales queries by {expected:.6g}"
        f" (gemma3-4b/12b: head_dim**-0.5 = {cfg.head_dim}**-0.5; gemma3-27b: (hidden/heads)**-0.5 ="
        f" {per_head}**-0.5);"
        + (f" target {fitting} instead" if fitting else " no MaxText gemma3 model name reproduces this checkpoint")
    )
  common.layer_pattern(cfg, _decoder(cfg, target), hf_pattern=int(cfg.get("sliding_window_pattern") or 6))
  warnings = common.gemma_checks(cfg, target, "hidden_activation")
  if cfg.architecture == MULTIMODAL and cfg.get("final_logit_softcapping"):
    warnings.append(f"{cfg.path}: final_logit_softcapping={cfg.get('final_logit_softcapping')} is ignored by"
                    f" transformers' {MULTIMODAL}; the MaxText overrides turn it off (final_logits_soft_cap=0) to match")
  if cfg.get("attn_logit_softcapping"):
    warnings.append(f"{cfg.path}: attn_logit_softcapping={cfg.get('attn_logit_softcapping')} is ignored by"
                    " transformers' Gemma3 attention; the MaxText overrides turn it off (attn_logits_soft_cap=0) to"
                    " match")
  _, _, full, local = rope(cfg)
  if common.rope_kind(full) not in ("default", "linear") or common.rope_kind(local) != "default":
    warnings.append(f"{cfg.path}: rope scaling global {full}, local {local}; MaxText's gemma3 applies only linear"
                    " scaling, to global layers")
  return warnings


FAMILY = Family(
    name="gemma3",
    architectures=("Gemma3ForCausalLM", MULTIMODAL),
    targets=("gemma3",),
    infer_target=_infer_target,
    runtime=_runtime,
    layout=_layout,
    check=_check,
    towers=_towers,
    tensor_aliases=lambda cfg: ALIASES if cfg.architecture == MULTIMODAL else (),
)
