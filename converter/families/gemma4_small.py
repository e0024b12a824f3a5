"""Gemma 4 small (`gemma4-e2b`, `gemma4-e4b`): Gemma 4's dense decoder (gemma4.py) plus per-layer embeddings and
KV sharing, from `Gemma4ForCausalLM` or the hub's `Gemma4ForConditionalGeneration`. MaxText 0.2.5 has no multimodal
form of these two names (configs/types.py refuses `use_multimodal` for them: their vision towers use clipped
linears, which its Gemma 4 tower lacks, and it has no Gemma 4 audio encoder), so a multimodal checkpoint converts
its text decoder alone, with a warning that says so, and its towers and embedders are skipped.

Per-layer embeddings (PLE): one more table `embed_tokens_per_layer` (V_ple, L*P), stored unscaled (MaxText multiplies
by sqrt(P) at run time), mixed with a projection of the token embedding, gate a residual branch at the end of every
layer. The last `num_kv_shared_layers` layers reuse the keys and values of the last earlier layer of their kind, so
they have no k/v projections or key norm; with `use_double_wide_mlp` their MLPs are twice as wide. MaxText repeats
4 sliding layers and a global one for exactly the name gemma4-e2b, 5 and 1 for any other. It has no scanned form
of this decoder (configs/types.py refuses scan_layers for both names).
"""

from __future__ import annotations

import re

from converter import ops
from converter.errors import ConversionError
from converter.families import common, gemma4
from converter.families.base import Family, LayerGroup, Layout, Param
from converter.families.runtime import Decoder, Runtime
from converter.model_config import ModelConfig

E2B, E4B = "gemma4-e2b", "gemma4-e4b"
# models/gemma4_small.py get_attention_pattern: period 5 for the exact name gemma4-e2b, else period 6.
PATTERNS = {E2B: (True,) * 4 + (False,), E4B: gemma4.PATTERN}


def _decoder(target: str) -> Decoder:
  return gemma4.decoder(PATTERNS[target])


def _kv_shared(cfg: ModelConfig, layer: int) -> bool:
  """MaxText's is_kv_shared_layer: one of the last `num_kv_shared_layers`, if any layer comes before them."""
  first = cfg.num_layers - int(gemma4.hf(cfg, "num_kv_shared_layers"))
  return layer >= first > 0


def _per_layer_inputs(cfg: ModelConfig) -> int:
  return int(gemma4.hf(cfg, "hidden_size_per_layer_input"))


def _per_layer_embedder(cfg: ModelConfig) -> tuple[Param, ...]:
  E, L, P = cfg.hidden_size, cfg.num_layers, _per_layer_inputs(cfg)
  model, ple = gemma4.text_model(cfg), "decoder/per_layer_embedder"
  return (
      Param(f"{ple}/embed_tokens_per_layer", f"{model}.embed_tokens_per_layer.weight",
            (int(gemma4.hf(cfg, "vocab_size_per_layer_input")), L * P)),
      Param(f"{ple}/per_layer_model_projection/kernel", f"{model}.per_layer_model_projection.weight", (L * P, E),
            (ops.Transpose(),)),
      Param(f"{ple}/per_layer_projection_norm/scale", f"{model}.per_layer_projection_norm.weight", (P,)),
  )


def _layer(cfg: ModelConfig, target: str, i: int) -> tuple[Param, ...]:
  layer = f"{gemma4.text_model(cfg)}.layers.{{layer}}"
  E, P = cfg.hidden_size, _per_layer_inputs(cfg)
  local_dims, global_dims = gemma4.head_dims(cfg)
  pattern, shared = PATTERNS[target], _kv_shared(cfg, i)
  wide = 2 if shared and gemma4.hf(cfg, "use_double_wide_mlp") else 1
  params = (gemma4.norms(cfg, layer, _decoder(target))
            + gemma4.attention(cfg, layer, local_dims if pattern[i % len(pattern)] else global_dims, keys=not shared)
            + common.dense_mlp(cfg, "mlp", f"{layer}.mlp", wide * cfg.intermediate_size))
  if not P:
    return params
  return params + (
      Param("per_layer_input_gate/kernel", f"{layer}.per_layer_input_gate.weight", (P, E), (ops.Transpose(),)),
      Param("per_layer_projection/kernel", f"{layer}.per_layer_projection.weight", (E, P), (ops.Transpose(),)),
      Param("post_per_layer_input_norm/scale", f"{layer}.post_per_layer_input_norm.weight", (E,)),
  )


def _layout(cfg: ModelConfig, target: str, target_vocab: int, scan_layers: bool) -> Layout:
  if scan_layers:
    raise ConversionError(f"--scan_layers=true: MaxText 0.2.5 has no scanned form of {target} (its gemma4_small"
                          " decoder shares keys and values across layers and refuses scan_layers=true); convert with"
                          " --noscan_layers")
  top = common.embeddings(cfg, target_vocab, gemma4.rules(cfg), model=gemma4.text_model(cfg))
  if _per_layer_inputs(cfg):
    top += _per_layer_embedder(cfg)
  return Layout(top, tuple(LayerGroup(("decoder", f"layers_{i}"), (i,), False, _layer(cfg, target, i))
                           for i in range(cfg.num_layers)))


def _runtime(cfg: ModelConfig, target: str) -> Runtime:
  return common.runtime(
      cfg, _decoder(target), **gemma4.overrides(cfg), hidden_size_per_layer_input=_per_layer_inputs(cfg),
      vocab_size_per_layer_input=int(gemma4.hf(cfg, "vocab_size_per_layer_input")),
      num_kv_shared_layers=int(gemma4.hf(cfg, "num_kv_shared_layers")),
      use_double_wide_mlp=bool(gemma4.hf(cfg, "use_double_wide_mlp")))


def _check(cfg: ModelConfig, target: str) -> list[str]:
  if gemma4.hf(cfg, "enable_moe_block"):
    raise ConversionError(f"{cfg.path}: enable_moe_block is true in a model with per-layer inputs or KV-shared"
                          f" layers: MaxText's {target} (gemma4_small) has no experts, its gemma4 decoder neither of"
                          " the others")
  if gemma4.hf(cfg, "attention_k_eq_v"):
    raise ConversionError(f"{cfg.path}: attention_k_eq_v is true; MaxText's {target} (gemma4_small) has a value"
                          " projection in every layer that computes keys")
  warnings = gemma4.checks(cfg, target, _decoder(target))
  if cfg.architecture == gemma4.MULTIMODAL:
    warnings.append(f"{cfg.path}: {target} has no multimodal form in MaxText 0.2.5 (it refuses use_multimodal for"
                    f" {E2B} and {E4B}): converting the text decoder alone, its towers and embedders skipped; the"
                    " converted model takes text only")
  return warnings


def _ignored(cfg: ModelConfig) -> dict[str, str]:
  """Also the vision tower and embedder of a multimodal checkpoint (no multimodal form in MaxText), and the k/v
  projections and norms hub checkpoints keep for KV-shared layers (transformers drops them)."""
  ignored = gemma4.ignored(cfg)
  if cfg.architecture == gemma4.MULTIMODAL:
    ignored[r"model\.(vision_tower|embed_vision)\."] = (
        f"Gemma 4's vision tower and its embedder: MaxText 0.2.5 runs {E2B} and {E4B} on text only")
  shared = [str(i) for i in range(cfg.num_layers) if _kv_shared(cfg, i)]
  if shared:
    ignored[rf"{re.escape(gemma4.text_model(cfg))}\.layers\.({'|'.join(shared)})\.self_attn\.(k_proj|v_proj|k_norm|"
            r"v_norm)\."] = "keys and values of KV-shared layers, which reuse an earlier layer's"
  return ignored


FAMILY = Family(
    name="gemma4_small",
    architectures=gemma4.ARCHITECTURES,
    targets=(E2B, E4B),
    infer_target=lambda cfg: E2B if gemma4.layer_types(cfg).index("full_attention") == 4 else E4B,
    runtime=_runtime,
    layout=_layout,
    check=_check,
    ignored_tensors=_ignored,
    reads=gemma4.is_small,
)
