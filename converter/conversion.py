"""HF to MaxText conversion as a library call: plan, then save into the output. The binary in main.py is a thin
shell around it.

Planning needs neither JAX nor Orbax (config.json and the safetensors headers alone); they are imported when a
save starts, so a bad input fails, and a conversion starts reading its first bytes (`read_ahead`) and blocks
(`read_early`), while they load."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from absl import logging

from converter import families, sources, storage
from converter.planning import lazy_leaves
from converter.errors import ConversionError
from converter.families import ResolvedModel
from converter.model_config import check_claimed_counts, load_model_config
from converter.options import PlanOptions, RunContext, SaveOptions
from converter.output.record import conversion_record
from converter.planning.plan import Plan, alias_renamer, build_plan
from converter.sources import lora
from handlers.early_reads import EarlyReads


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
  families.family_for_architecture(config.architecture, config.path, config)  # Named before the tensors are read.
  sources.check_quantization(config.raw, config.path)
  source = sources.open_source(hf_model_path, config.raw, config.path)
  check_claimed_counts(config, (t.shape for t in source.tensors.values()), source.location)
  model = families.resolve(config, target_model=options.target_model, text_only=options.text_only)
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


def read_ahead(plan: Plan, nbytes: int) -> int:
  """Asks storage to start fetching the stored bytes of the leaves a save writes first (Orbax writes a tree's
  leaves in key order), about `nbytes` of them, without waiting: a conversion's first reads then overlap its
  start-up. Returns the bytes asked for."""
  asked = 0
  for leaf in lazy_leaves.in_writing_order(plan):
    for tensor in leaf.loader.source_tensors():
      for path, begin, end in tensor.byte_ranges:
        if asked >= nbytes:
          return asked
        end = min(end, begin + nbytes - asked)
        storage.read_ahead(path, begin, end)
        asked += end - begin
  return asked


def read_early(plan: Plan, options: SaveOptions) -> EarlyReads:
  """Starts reading the first blocks a one-process lazy save of `plan` writes, on a worker thread, without JAX or
  Orbax: pass it to `save_plan` (`RunContext.early_reads`), whose writer takes them instead of reading them."""
  return lazy_leaves.read_early(plan, devices=options.devices, max_inflight_bytes=options.max_inflight_bytes)


def save_plan(plan: Plan, output_dir: str, save_options: SaveOptions | None = None,
              run: RunContext | None = None) -> ConversionResult:
  """Saves `plan` (plan_conversion's) into `output_dir`. A lazy save journals its blocks so that `run.resume` can
  finish it later.

  With several processes, every process runs this with the same arguments: the primary prepares the output,
  each writes its share of the blocks, and the primary commits once all have finished.
  """
  from converter.output.maxtext import MaxTextOutput  # pylint: disable=g-import-not-at-top  (Orbax, JAX)

  overrides = plan.runtime.config.overrides()
  written = MaxTextOutput(output_dir, run or RunContext()).write(plan, save_options or SaveOptions(),
                                                                 conversion_record(plan, overrides))
  return ConversionResult(plan, written.items_path, overrides, written.resumed_blocks, written.written_bytes)


def convert_to_maxtext(hf_model_path: str, output_dir: str, plan_options: PlanOptions = PlanOptions(),
                       save_options: SaveOptions | None = None, run: RunContext | None = None) -> ConversionResult:
  """Plans, checks and saves (`save_plan`)."""
  return save_plan(plan_conversion(hf_model_path, plan_options), output_dir, save_options, run)
