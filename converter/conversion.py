"""HF to MaxText conversion as a library call: plan, then save into the output. The binary in main.py is a thin
shell around it."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from absl import logging

from converter import families, sources
from converter.errors import ConversionError
from converter.families import ResolvedModel
from converter.model_config import load_model_config
from converter.options import PlanOptions, RunContext, SaveOptions
from converter.output.maxtext import MaxTextOutput
from converter.output.record import ConversionRecord
from converter.plan import Plan, alias_renamer, build_plan
from converter.sources import lora


@dataclasses.dataclass(frozen=True)
class ConversionResult:
  plan: Plan
  items_path: str
  overrides: dict[str, Any]
  resumed_blocks: int = 0  # Blocks an interrupted run had written, reused rather than recomputed.
  written_bytes: int = 0  # Bytes of blocks this process wrote (its share, with several processes).


def plan_conversion(hf_model_path: str, options: PlanOptions) -> Plan:
  """Everything checkable from config.json and the safetensors headers (and a LoRA adapter's config and header),
  before a byte is written."""
  config = load_model_config(hf_model_path)
  model = families.resolve(config, target_model=options.target_model, text_only=options.text_only)
  sources.check_quantization(config.raw, config.path)
  source = sources.open_source(hf_model_path, config.raw, config.path)
  if options.lora_adapter_path:
    source = _with_adapter(source, model, options)
  plan = build_plan(source, model, options)
  if options.lora_adapter_path:
    _check_adapter_targets_read(plan, model)
  for warning in plan.warnings:
    logging.warning("%s", warning)
  return plan


def _with_adapter(source: sources.TensorSource, model: ResolvedModel, options: PlanOptions) -> lora.LoraMergedSource:
  """`source` with the adapter merged into its weights, matched through the family's aliases."""
  adapter = lora.read_adapter(options.lora_adapter_path)
  if options.keep_fp8:
    raise ConversionError(f"{adapter.location}: --keep_fp8 keeps the FP8 kernels as stored, so a LoRA adapter cannot"
                          " be merged into them; convert without --keep_fp8 (dequantized), or merge first")
  return lora.merged_source(source, adapter, alias_renamer(model.tensor_aliases()))


def _check_adapter_targets_read(plan: Plan, model: ResolvedModel) -> None:
  """Every adapted weight must reach the checkpoint: one the family skips (a tower under --text_only, an MTP
  block) or does not read would lose its merge silently."""
  source = plan.source
  read = {name for leaf in plan.leaves for name in leaf.sources}
  rename = alias_renamer(model.tensor_aliases())
  ignored = [(re.compile(pattern), reason) for pattern, reason in model.ignored_tensors().items()]
  for module, stored in source.merged.items():
    if stored in read:
      continue
    reason = next((r for p, r in ignored if p.match(rename(stored))), None)
    raise ConversionError(
        f"{source.adapter.weights_path}: module {module!r} adapts {stored!r}, which {model.family.name}"
        f" ({model.target}) does not convert ({f'skipped: {reason}' if reason else 'a tensor it does not read'});"
        " the adapter's change to it would be lost")


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
