"""The conversion record a conversion writes (converter/checkpoint_format/record.py holds its schema and reads it
back): what the plan says of the output, and what its source states of itself (`TensorSource.facts`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from converter import json_input, storage
from converter.checkpoint_format.original import Original
from converter.checkpoint_format.record import ConversionRecord


def conversion_record(plan: Any, overrides: dict[str, Any]) -> ConversionRecord:
  """The record of a conversion of `plan` (converter/planning/plan.py) with MaxText `overrides`. A MaxText
  checkpoint laid out again (converter/planning/relayout.py) keeps what its own record says of the original
  (config, where it was read, its format, a merged adapter), unless --hf_config_path named a config.json."""
  facts = plan.source.facts
  origin = facts.original
  if origin is not None and not storage.is_file(plan.config.path):
    hf_config, hf_source = origin.hf_config, origin.hf_source
  else:
    hf_config = json_input.read(plan.config.path, "malformed config.json")
    hf_source = Original.of_directory(storage.parent(plan.config.path)).record()
  return ConversionRecord(
      scan_layers=plan.scan_layers,
      family=plan.family.name,
      target_model=plan.target_model,
      hf_architecture=plan.config.architecture,
      save_dtype=plan.save_dtype.name,
      quant_method=facts.quant_method,
      fp8=dataclasses.asdict(plan.fp8) if plan.fp8 else None,
      maxtext_overrides=overrides,
      hf_config=hf_config,
      hf_source=hf_source,
      chunking=plan.chunking.record(),
      logical_axes={leaf.name: None if leaf.logical_axes is None else list(leaf.logical_axes)
                    for leaf in plan.leaves},
      lora_adapter=facts.lora_adapter,
  )
