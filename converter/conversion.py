"""HF to MaxText conversion as a library call: plan, check, save. The binary in main.py is a thin shell."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from absl import logging

from converter import conversion_record, families, writer
from converter.errors import ConversionError
from converter.model_config import load_model_config
from converter.plan import Plan, build_plan
from converter.progress import Progress
from converter import processes as processes_lib
from converter import resume as resume_lib
from converter import sources
from handlers import DEFAULT_MAX_INFLIGHT_BYTES, BlockWritten, Processes


@dataclasses.dataclass(frozen=True)
class ConversionResult:
  plan: Plan
  items_path: str
  overrides: dict[str, Any]
  resumed_blocks: int = 0  # Blocks an interrupted run had written, reused rather than recomputed.
  written_bytes: int = 0  # Bytes of blocks this process wrote (its share, with several processes).


def plan_conversion(
    hf_model_path: str,
    *,
    scan_layers: bool,
    save_dtype: str,
    target_model: str | None = None,
    target_vocab_size: int | None = None,
    allow_unused_tensors: bool = False,
    keep_fp8: bool = False,
) -> Plan:
  config = load_model_config(hf_model_path)
  model = families.resolve(config, target_model=target_model)
  sources.check_quantization(config.raw, config.path)
  plan = build_plan(
      sources.open_source(hf_model_path, config.raw, config.path),
      model,
      scan_layers=scan_layers,
      save_dtype=save_dtype,
      target_vocab_size=target_vocab_size,
      allow_unused_tensors=allow_unused_tensors,
      keep_fp8=keep_fp8,
  )
  for warning in plan.warnings:
    logging.warning("%s", warning)
  return plan


def convert_to_maxtext(
    hf_model_path: str,
    output_dir: str,
    *,
    scan_layers: bool,
    lazy: bool,
    devices: int,
    save_dtype: str,
    overwrite: bool = False,
    target_model: str | None = None,
    target_vocab_size: int | None = None,
    allow_unused_tensors: bool = False,
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES,
    progress: Progress | None = None,
    resume: bool = False,
    cancel: threading.Event | None = None,
    keep_fp8: bool = False,
    processes: Processes = Processes(),
    compression: bool = True,
) -> ConversionResult:
  """Plans, checks and saves. A lazy save journals its blocks so that `resume=True` can finish it later.

  With several `processes`, every process runs this with the same arguments: the primary prepares the output,
  each writes its share of the blocks, and the primary commits once all have finished.
  """
  plan = plan_conversion(
      hf_model_path,
      scan_layers=scan_layers,
      save_dtype=save_dtype,
      target_model=target_model,
      target_vocab_size=target_vocab_size,
      allow_unused_tensors=allow_unused_tensors,
      keep_fp8=keep_fp8,
  )
  if processes.is_primary:
    writer.prepare_output_dir(output_dir, overwrite, keep_unfinished=lazy)
  processes_lib.barrier("output prepared", processes)
  salvage, journal = (resume_lib.prepare(output_dir, plan, resume=resume, processes=processes) if lazy
                      else (None, None))
  overrides = plan.runtime.config.overrides()
  metadata = conversion_record.build(plan, overrides)
  if progress is not None:
    progress.start(plan.total_bytes)
  listeners = [c for c in (progress, journal) if c is not None]
  written = [0]

  def block_written(event: BlockWritten) -> None:
    written[0] += event.nbytes
    for listener in listeners:
      listener(event)

  try:
    items_path = writer.save(
        resume_lib.with_salvage(plan, salvage) if salvage else plan, output_dir, lazy=lazy, devices=devices,
        max_inflight_bytes=max_inflight_bytes, custom_metadata=metadata, on_block_written=block_written,
        keep_unfinished=journal is not None, cancel=cancel, processes=processes, compression=compression,
    )
  except ConversionError as e:
    if journal is not None and resume_lib.park(output_dir, journal):
      raise ConversionError(f"{e}; nothing was committed, and what was written is kept: rerun with --resume"
                            " to continue") from e
    raise ConversionError(f"{e}; nothing was committed") from e
  except BaseException:
    if journal is not None:
      resume_lib.park(output_dir, journal)
    raise
  if journal is not None:
    journal.close()
  processes_lib.barrier("committed", processes)  # The primary commits last; nobody reads the output before.
  if journal is not None and processes.is_primary:
    resume_lib.finish(output_dir)
  return ConversionResult(plan, items_path, overrides, len(salvage.blocks) if salvage else 0, written[0])
