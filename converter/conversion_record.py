"""The conversion record: what a conversion writes into the step's _CHECKPOINT_METADATA (Orbax's custom_metadata)
and what the reverse direction, the validator and a resumed run read back from it.

  {"scan_layers": bool, "hf2maxtext": {"family", "target_model", "hf_architecture", "save_dtype", "quant_method",
   "fp8", "maxtext_overrides", "hf_config"}}
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from converter import orbax_layout, storage
from converter.errors import ConversionError

KEY = "hf2maxtext"


def build(plan: Any, overrides: dict[str, Any]) -> dict[str, Any]:
  """The custom_metadata of a conversion of `plan` with MaxText `overrides`."""
  return {
      "scan_layers": plan.scan_layers,
      KEY: {
          "family": plan.family.name,
          "target_model": plan.target_model,
          "hf_architecture": plan.config.architecture,
          "save_dtype": plan.save_dtype.name,
          # How the source stored its weights (None: plain floats); the reverse direction says it dequantized.
          "quant_method": plan.source.quant_method,
          # --keep_fp8: the FP8 kernels were kept, beside their scales (None: every leaf in save_dtype).
          "fp8": dataclasses.asdict(plan.fp8) if plan.fp8 else None,
          "maxtext_overrides": overrides,
          # The original config.json, verbatim: --direction=to_huggingface writes it back.
          "hf_config": json.loads(storage.read_text(plan.config.path)),
      },
  }


def custom_metadata(items_path: str) -> dict[str, Any]:
  """custom_metadata of the step's _CHECKPOINT_METADATA ({} when the file or the entry is absent)."""
  path = orbax_layout.metadata_path(items_path)
  if not storage.exists(path):
    return {}
  try:
    metadata = json.loads(storage.read_text(path))
  except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ConversionError(f"{path}: unreadable checkpoint metadata ({type(e).__name__}: {e})") from e
  return (metadata.get("custom_metadata") or {}) if isinstance(metadata, dict) else {}


def record(items_path: str) -> dict[str, Any]:
  """The hf2maxtext entry ({} for a checkpoint another tool wrote)."""
  return custom_metadata(items_path).get(KEY) or {}
