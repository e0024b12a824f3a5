"""HF to MaxText conversion as a library call: plan, then save into the output. The binary in main.py is a thin
shell around it."""

from __future__ import annotations

import dataclasses
from typing import Any

from absl import logging

from converter import families, sources
from converter.model_config import load_model_config
from converter.options import PlanOptions, RunContext, SaveOptions
from converter.output.maxtext import MaxTextOutput
from converter.output.record import ConversionRecord
from converter.plan import Plan, build_plan


@dataclasses.dataclass(frozen=True)
class ConversionResult:
  plan: Plan
  items_path: str
  overrides: dict[str, Any]
  resumed_blocks: int = 0  # Blocks an interrupted run had written, reused rather than recomputed.
  written_bytes: int = 0  # Bytes of blocks this process wrote (its share, with several processes).


def plan_conversion(hf_model_path: str, options: PlanOptions) -> Plan:
  """Everything checkable from config.json and the safetensors headers, before a byte is written."""
  config = load_model_config(hf_model_path)
  model = families.resolve(config, target_model=options.target_model, text_only=options.text_only)
  sources.check_quantization(config.raw, config.path)
  plan = build_plan(sources.open_source(hf_model_path, config.raw, config.path), model, options)
  for warning in plan.warnings:
    logging.warning("%s", warning)
  return plan


def convert_to_maxtext(hf_model_path: str, output_dir: str, plan_options: PlanOptions = PlanOptions(),
                       save_options: SaveOptions = SaveOptions(), run: RunContext = RunContext()) -> ConversionResult:
  """Plans, checks and saves. A lazy save journals its blocks so that `run.resume` can finish it later.

  With several processes, every process runs this with the same arguments: the primary prepares the output,
  each writes its share of the blocks, and the primary commits once all have finished.
  """
  plan = plan_conversion(hf_model_path, plan_options)
  overrides = plan.runtime.config.overrides()
  written = MaxTextOutput(output_dir, run).write(plan, save_options, ConversionRecord.of_plan(plan, overrides))
  return ConversionResult(plan, written.items_path, overrides, written.resumed_blocks, written.written_bytes)
