"""Converts a HuggingFace safetensors checkpoint into a MaxText-ready Orbax checkpoint.

  bazel run //converter -- --hf_model_path=/models/Qwen3-8B --output_dir=/ckpt/qwen3-8b

MaxText then loads it with `load_parameters_path=<output_dir>/0/items`. And back to HuggingFace safetensors:

  bazel run //converter -- --direction=to_huggingface --checkpoint_path=/ckpt/qwen3-8b/0/items \
      --output_dir=/models/Qwen3-8B-roundtrip
"""

from __future__ import annotations

import functools
import gc
import json
import os
import resource
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, NoReturn

# Set before numpy loads OpenBLAS, which otherwise starts a thread per core that spins before it sleeps: 0.1
# CPU-s of every start-up, in every process (docs/memory-and-streaming.md). The converter multiplies no matrices.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# pylint: disable=g-import-not-at-top,g-bad-import-order
from absl import app, flags, logging

from converter import library_logs
from converter import malloc
from converter.storage.hub import is_hub
from converter.layout.chunking import ChunkRule, parse_mesh
from converter.options import PlanOptions, ReverseOptions, RunContext, SaveOptions
from converter.planning.plan import Plan
# pylint: enable=g-import-not-at-top,g-bad-import-order

if TYPE_CHECKING:
  from handlers.early_reads import EarlyReads

FLAGS = flags.FLAGS

flags.DEFINE_enum("direction", "to_maxtext", ["to_maxtext", "to_huggingface"],
                  "to_maxtext: HF safetensors -> Orbax checkpoint. to_huggingface: Orbax checkpoint -> HF safetensors.")
flags.DEFINE_string("hf_model_path", None, "HF checkpoint: a directory (config.json + safetensors), a bucket path"
                    " (gs://BUCKET/DIR) or a Hub repo id (ORG/NAME, see --revision); to_maxtext only.")
flags.DEFINE_string("revision", "main", "Hub revision (branch, tag or commit) when --hf_model_path is a repo id;"
                    " resolved once to its commit, which every read names and the conversion record keeps.")
flags.DEFINE_boolean("hub_download_first", False, "A Hub repo id's files are downloaded whole into the HF cache before"
                     " they are read (a cached copy for later runs, at the model's size on disk), instead of reading"
                     " the weights by range requests as the conversion needs them (docs/buckets-and-hub.md).")
flags.DEFINE_integer("hub_connections", 16, "Range requests to the Hub in flight at once; a read larger than 8 MiB is"
                     " fetched in parts over several of them.", lower_bound=1)
flags.DEFINE_string("lora_adapter_path", None, "to_maxtext: a PEFT LoRA adapter (adapter_config.json +"
                    " adapter_model.safetensors) merged into the weights while converting: a directory, a bucket"
                    " path or a Hub repo id, as --hf_model_path (docs/lora.md).")
flags.DEFINE_string("lora_adapter_revision", "main", "Hub revision when --lora_adapter_path is a repo id.")
flags.DEFINE_boolean("lora_adapter_only", False, "to_maxtext with --lora_adapter_path: write the adapter alone as a"
                     " MaxText LoRA checkpoint (OUTPUT_DIR/0/items) that MaxText's LoRA training restores"
                     " (lora.lora_restore_path), instead of merging it; of --hf_model_path only config.json is read"
                     " (docs/lora.md).")
flags.DEFINE_string("output_dir", None, "to_maxtext: directory for the Orbax checkpoint (step 0 is written to"
                    " OUTPUT_DIR/0). to_huggingface: the HF checkpoint directory to create, or a Hub repo,"
                    " hf://ORG/NAME[@BRANCH], pushed in one commit (docs/buckets-and-hub.md).")
flags.DEFINE_boolean("hub_private", False, "to_huggingface to hf://: create the repo private when it does not exist.")
flags.DEFINE_string("checkpoint_path", None, "A MaxText checkpoint to read (OUTPUT_DIR/0/items, or a step directory):"
                    " to_huggingface: converted back. to_maxtext (instead of --hf_model_path): laid out again as a"
                    " params-only checkpoint with --scan_layers, --save_dtype and the chunk flags (ours, MaxText's"
                    " converter's, or a trainer's TrainState; docs/relayout.md).")
flags.DEFINE_string("step", "latest", "--checkpoint_path naming a training run's checkpoint directory"
                    " (RUN_DIR/<step>/items, or MaxText's RUN_DIR/checkpoints/<step>/items; local or gs://): the"
                    " step to read, latest (the highest committed one) or a number (docs/reverse.md).")
flags.DEFINE_enum("export", "model", ["model", "lora_adapter"], "to_huggingface: model: the HF checkpoint."
                  " lora_adapter: a MaxText LoRA checkpoint's qwix factors (kernel_lora_a / kernel_lora_b) as a PEFT"
                  " adapter directory (adapter_config.json + adapter_model.safetensors) for the base model of"
                  " --hf_config_path (docs/lora.md).")
flags.DEFINE_float("lora_alpha", None, "--export=lora_adapter and --lora_checkpoint_path: the adapter's lora_alpha,"
                   " for a LoRA checkpoint whose metadata records none (MaxText's trainer records it).")
flags.DEFINE_string("lora_checkpoint_path", None, "A MaxText LoRA checkpoint (OUT/0/items of a MaxText LoRA run,"
                    " or ours) merged in float32 into --checkpoint_path's base: to_huggingface: one full HF model;"
                    " to_maxtext: one MaxText checkpoint (docs/lora.md).")
flags.DEFINE_string("max_shard_size", "5GB", "to_huggingface: largest safetensors shard, e.g. 5GB, 500MB, 2GiB.")
flags.DEFINE_string("family", None, "--checkpoint_path: model family (default: recorded in the checkpoint metadata).")
flags.DEFINE_string("hf_config_path", None, "--checkpoint_path: the original config.json (or its directory), for"
                    " checkpoints whose metadata does not record it (e.g. written by MaxText).")
flags.DEFINE_boolean("scan_layers", True, "Stack decoder layers into one leaf per parameter (MaxText scan_layers).")
flags.DEFINE_boolean("lazy_load_tensors", True, "Read each tensor only when Orbax writes it (false: read all first).")
flags.DEFINE_integer(
    "simulated_cpu_devices_count", 16, "CPU devices JAX simulates; leaves are sharded over them when > 1.", lower_bound=1
)
flags.DEFINE_enum("save_dtype", "bfloat16", ["bfloat16", "float32"], "dtype of every saved parameter.")
flags.DEFINE_boolean("overwrite", False, "Replace an existing checkpoint at OUTPUT_DIR/0.")
flags.DEFINE_string("target_model", None, "MaxText model the checkpoint is for (default: inferred from config.json).")
flags.DEFINE_integer("target_vocab_size", None, "Zero-pad the vocabulary to this size (MaxText configs may round up).")
flags.DEFINE_boolean("allow_unused_tensors", False, "Warn about, rather than refuse, tensors the family does not use.")
flags.DEFINE_boolean("allow_uncommitted", False, "--checkpoint_path, --lora_checkpoint_path: read a step whose save"
                     " never committed (a local *.orbax-checkpoint-tmp* directory, a bucket step without"
                     " commit_success.txt) instead of refusing it.")
flags.DEFINE_integer("max_inflight_bytes", 128 << 20, "Most bytes of materialised blocks alive at once while saving"
                     " (to_huggingface: of pieces read ahead of the writes).")
flags.DEFINE_boolean("inspect", False, "With --checkpoint_path: print what the MaxText checkpoint holds (a run"
                     " directory's steps, every leaf's shape, dtype, chunks and codecs, the layout, the conversion"
                     " record) from its metadata, and exit; no --output_dir (docs/reverse.md).")
flags.DEFINE_boolean("dry_run", False, "Read only config.json and the safetensors headers; print the plan and exit.")
flags.DEFINE_boolean("verify", False, "After saving, re-read every leaf block by block and compare with the source.")
flags.DEFINE_boolean("resume", False, "Continue an interrupted conversion into OUTPUT_DIR from what it wrote durably.")
flags.DEFINE_boolean("text_only", False, "Multimodal checkpoints: convert the text decoder alone, skipping the vision"
                     " (and audio) towers and projectors; MaxText then runs it with use_multimodal=false.")
flags.DEFINE_string("target_mesh", None, "Cut every leaf's stored chunks at its shards on this MaxText mesh (its"
                    " ici/dcn parallelism names, e.g. fsdp=64,tensor=4,expert=8): a restore on it reads each stored"
                    " byte once. Default: chunks cut along the axes MaxText shards on fsdp, for any power-of-two fsdp"
                    " mesh up to --chunk_fsdp_max.")
flags.DEFINE_integer("target_devices_per_host", 4, "With --target_mesh: devices per restoring host (4 on TPU v4,"
                     " v5p and multi-host v5e/v6e slices; a CPU or GPU host's own count). Each host's part of every"
                     " leaf is stored in files of its own, as Orbax saving from that mesh stores it.", lower_bound=1)
flags.DEFINE_integer("chunk_fsdp_max", 64, "Default layout: the largest fsdp mesh (a power of two) whose every host"
                     " reads each stored chunk it needs once.", lower_bound=1)
flags.DEFINE_boolean("chunk_layout", True, "Cut stored chunks for the restoring mesh (--target_mesh or the fsdp"
                     " default); false stores each write block as one chunk, as before (for comparisons).")
flags.DEFINE_enum("chunk_element_order", "maxtext", ["maxtext", "huggingface"], "Order of the elements inside each"
                  " stored chunk: MaxText's (the conversion transposes the kernels) or the HuggingFace tensors' (the"
                  " store's copy transposes them, and every restore undoes it while decoding: a cheaper conversion,"
                  " a slower restore). Readers read both.")
flags.DEFINE_boolean("keep_fp8", False, "FP8 checkpoints: keep the FP8 kernels and write their block scales, as"
                     " MaxText's fp8 models hold them (e.g. qwen3.5-35b-a3b-fp8); half the bytes. Default: dequantize.")
flags.DEFINE_enum("compression", "zstd", ["zstd", "none"], "Stored arrays' codec: zstd (Orbax's default, level 3)"
                  " or none (larger, and no compressor in the way: for local scratch). MaxText reads both.")
flags.DEFINE_integer("zstd_level", None, "zstd's level for compressed chunks; default 1 (as few bytes stored as"
                     " Orbax's 3 on weights, a quarter less CPU), 3 where FP8 weights are dequantized (their few"
                     " distinct values repeat). Readers read any level.", lower_bound=1, upper_bound=22)
flags.DEFINE_boolean("chunk_checksums", True, "A checksum on every stored chunk (zstd's own, or a crc32c when"
                     " uncompressed), which every restore (Orbax, MaxText) verifies: a damaged byte fails the restore instead of loading a wrong weight. false writes"
                     " chunks without one, as versions before 2026-12 did (for comparisons).")
flags.DEFINE_integer("storage_retries", 10, "Buckets: retries of one failed request (backing off 1 s, 2 s, ... up to"
                     " 32 s) before the conversion fails; 10 rides out about three minutes of outage.", lower_bound=0)
flags.DEFINE_enum("distributed", "off", ["off", "auto"], "auto: one conversion across every process of a TPU pod or"
                  " SLURM job, through jax.distributed.initialize() with no arguments (it discovers the rest).")
flags.DEFINE_string("coordinator_address", None, "Several processes: HOST:PORT of process 0's coordinator"
                    " (jax.distributed), e.g. 10.0.0.2:8476; with --num_processes and --process_id.")
flags.DEFINE_integer("num_processes", 1, "Processes converting one checkpoint together (each writes its share).",
                     lower_bound=1)
flags.DEFINE_integer("process_id", 0, "This process's index among --num_processes.", lower_bound=0)
flags.DEFINE_boolean("progress", True, "Progress bar on stderr (bytes, throughput, time left, RSS) when it is a terminal.")


@flags.multi_flags_validator(["direction", "hf_model_path", "checkpoint_path", "output_dir", "inspect"])
def _required_for_direction(values: dict) -> bool:
  if values["inspect"]:
    if not values["checkpoint_path"]:
      raise flags.ValidationError("--inspect reads --checkpoint_path")
    return True
  required = {"to_maxtext": ["hf_model_path", "output_dir"], "to_huggingface": ["checkpoint_path", "output_dir"]}
  if values["direction"] == "to_maxtext" and values["checkpoint_path"]:
    if values["hf_model_path"]:
      raise flags.ValidationError("--direction=to_maxtext reads --hf_model_path or --checkpoint_path, not both")
    required["to_maxtext"] = ["checkpoint_path", "output_dir"]
  missing = [f"--{name}" for name in required[values["direction"]] if not values[name]]
  if missing:
    raise flags.ValidationError(f"--direction={values['direction']} requires {' and '.join(missing)}")
  return True


def _resolve(path: str) -> str:
  from converter import storage  # pylint: disable=g-import-not-at-top

  return storage.resolve(path)


@functools.cache
def _checkpoint_path() -> str:
  """--checkpoint_path as one step's checkpoint: a run directory's --step chosen (checkpoint_format/steps.py); found
  once per run (the commit check and the conversion both ask, and on a bucket each look lists and stats objects)."""
  from converter.checkpoint_format import steps  # pylint: disable=g-import-not-at-top

  return steps.checkpoint_of(FLAGS.checkpoint_path, FLAGS.step, step_given=FLAGS["step"].present)


def _model_path(value: str, adapter: bool = False) -> str:
  """--hf_model_path, --hf_config_path (--lora_adapter_path with `adapter`): a bucket path, a local directory, or a
  Hub repo (ORG/NAME, hf://ORG/NAME[@REVISION]) as `hf://ORG/NAME@COMMIT`, its revision resolved once. With several
  processes the primary resolves it and the others take its commit, so that all read the same files."""
  from converter.storage import hub  # pylint: disable=g-import-not-at-top

  local = _resolve(value)
  if not hub.is_hub(value) and not hub.looks_like_repo_id(value, local):
    return local
  revision, first_file = ((FLAGS.lora_adapter_revision, "adapter_config.json") if adapter
                          else (FLAGS.revision, "config.json"))
  resolve = lambda: hub.repo_directory(value, revision, first_file)
  if _several_processes() and not FLAGS.dry_run:
    from converter import processes  # pylint: disable=g-import-not-at-top

    return processes.primary_value(f"hub/{value}@{revision}", resolve, processes.current().index)
  return resolve()


def _start_jax(devices: int, distributed: bool = False) -> None:
  """Simulated CPU devices must be configured before JAX initialises a backend; with several processes, JAX's
  distributed runtime joins them first (each then sees every process's devices, `devices` of them its own)."""
  import jax  # pylint: disable=g-import-not-at-top

  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", devices)
  if distributed and _several_processes():
    from converter import processes  # pylint: disable=g-import-not-at-top

    processes.join(auto=FLAGS.distributed == "auto", coordinator_address=FLAGS.coordinator_address,
                   num_processes=FLAGS.num_processes, process_id=FLAGS.process_id)
  if len(jax.local_devices()) != devices:
    raise app.UsageError(f"JAX started with {len(jax.local_devices())} local devices, not {devices}")


def _peak_rss_bytes() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _run_context(**kwargs) -> RunContext:
  """The run around a conversion; with several processes, JAX's distributed runtime must have joined them."""
  if _several_processes():
    from converter import processes  # pylint: disable=g-import-not-at-top

    kwargs["processes"] = processes.current()
  return RunContext(overwrite=FLAGS.overwrite, resume=FLAGS.resume, **kwargs)


def _reverse_options() -> ReverseOptions:
  return ReverseOptions(
      max_shard_size=FLAGS.max_shard_size,
      family=FLAGS.family,
      hf_config_path=_model_path(FLAGS.hf_config_path) if FLAGS.hf_config_path else None,
      target_model=FLAGS.target_model,
      read_ahead_bytes=FLAGS.max_inflight_bytes,
      lora_alpha=FLAGS.lora_alpha,
      lora_checkpoint_path=_resolve(FLAGS.lora_checkpoint_path) if FLAGS.lora_checkpoint_path else None,
      hub_private=FLAGS.hub_private,
  )


def _dry_run_to_huggingface() -> None:
  """--dry_run on the way back: reads the checkpoint's metadata only, writes nothing (not even the output's lock),
  asks nothing of the Hub."""
  import psutil  # pylint: disable=g-import-not-at-top
  from converter import storage  # pylint: disable=g-import-not-at-top
  from converter.reverse import dry_run, to_huggingface  # pylint: disable=g-import-not-at-top

  if FLAGS.export == "lora_adapter":
    raise app.UsageError("--dry_run plans a model written back, not --export=lora_adapter (an adapter's few"
                         " factors: write it)")
  _start_up_done()
  options = _reverse_options()
  way_back = to_huggingface.plan_way_back(_checkpoint_path(), options)
  print(dry_run.describe(way_back, options, baseline_bytes=psutil.Process().memory_info().rss))
  output_dir = _resolve(FLAGS.output_dir)
  if not is_hub(output_dir) and storage.list_names(output_dir) and not FLAGS.overwrite:
    print(f"warning: {output_dir} exists and is not empty; the conversion will refuse it without --overwrite")


def _run_to_huggingface() -> None:
  if FLAGS.dry_run:
    _dry_run_to_huggingface()
    return
  if _several_processes():  # JAX only joins them: arrays are read slice by slice into numpy, never onto devices.
    _start_jax(1, distributed=True)
  from converter.reverse import to_huggingface  # pylint: disable=g-import-not-at-top

  _start_up_done()

  start = time.monotonic()
  run = _run_context()
  options = _reverse_options()
  if FLAGS.export == "lora_adapter":
    _export_lora_adapter(options, run, start)
    return
  result = to_huggingface.convert_to_huggingface(_checkpoint_path(), _resolve(FLAGS.output_dir),
                                                 options, run)
  seconds = time.monotonic() - start
  plan = result.plan
  print(f"family:        {plan.family.name} ({plan.config.architecture}), from target model {plan.target_model}")
  print(f"checkpoint:    {plan.items_path}")
  print(f"tensors:       {result.num_tensors} ({'scanned' if plan.scan_layers else 'unscanned'} checkpoint,"
        f" {plan.dtype.name})")
  print(f"bytes:         {result.total_bytes:,}")
  print(f"shards:        {len(result.files)} ({result.files[0]}{' ...' if len(result.files) > 1 else ''})")
  print(f"seconds:       {seconds:.2f}")
  print(f"peak RSS:      {_peak_rss_bytes() / 2**20:.0f} MiB")
  print(f"output:        {result.output_dir}")
  if result.serving_files:
    print(f"copied:        {', '.join(result.serving_files)} (from {plan.original.describe()})")
  if result.merged_lora is not None:
    lora = result.merged_lora
    print(f"lora:          {len(lora.modules)} modules merged, r {lora.rank}, lora_alpha {lora.alpha:g}, from"
          f" {lora.items_path}")
  if run.processes.count > 1:
    print(f"process:       {run.processes.index} of {run.processes.count}, wrote {len(result.written_files)} of"
          f" {len(result.files)} shards")
  for warning in result.warnings:
    print(f"warning:       {warning}")
  if FLAGS.verify:
    _verify_written(result, options)


def _verify_written(result, options: ReverseOptions) -> None:
  from converter.errors import ConversionError  # pylint: disable=g-import-not-at-top
  from converter.progress import Progress  # pylint: disable=g-import-not-at-top
  from converter.reverse.verify import verify_written  # pylint: disable=g-import-not-at-top

  progress = Progress(enabled=FLAGS.progress, description="verifying")
  progress.start(sum(t.nbytes for name, shard in zip(result.files, result.shards) if name in result.written_files
                     for t in shard))
  report = verify_written(result, options, on_piece=progress.advance)
  progress.close()
  print(f"verified:      {report.tensors} tensors, {report.bytes:,} bytes, {len(report.mismatches)} mismatches")
  for mismatch in report.mismatches:
    print(f"mismatch:      {mismatch}")
  if report.mismatches:
    raise ConversionError(f"{result.output_dir}: --verify found {len(report.mismatches)} differences from the"
                          " checkpoint")


def _export_lora_adapter(options: ReverseOptions, run: RunContext, start: float) -> None:
  from converter.reverse import lora_adapter  # pylint: disable=g-import-not-at-top

  export = lora_adapter.export_lora_adapter(_checkpoint_path(), _resolve(FLAGS.output_dir), options, run)
  print(f"family:        {export.family}, target model {export.target_model}")
  print(f"lora:          {len(export.modules)} modules, r {export.rank}, lora_alpha {export.alpha:g}"
        f" ({export.dtype.name})")
  print(f"seconds:       {time.monotonic() - start:.2f}")
  print(f"output:        {_resolve(FLAGS.output_dir)} (PEFT adapter for {export.base_model})")


_TO_MAXTEXT_ONLY = ("scan_layers", "lazy_load_tensors", "simulated_cpu_devices_count", "save_dtype",
                    "target_vocab_size", "allow_unused_tensors", "resume",
                    "keep_fp8", "revision", "compression", "zstd_level", "chunk_checksums", "lora_adapter_path",
                    "lora_adapter_revision", "lora_adapter_only")


def _refuse_uncommitted() -> None:
  """A MaxText checkpoint read (--checkpoint_path, --lora_checkpoint_path) must be a finished save, unless
  --allow_uncommitted."""
  from converter.checkpoint_format import layout  # pylint: disable=g-import-not-at-top
  from converter.errors import ConversionError  # pylint: disable=g-import-not-at-top

  if FLAGS.allow_uncommitted:
    return
  for flag, path in (("checkpoint_path", FLAGS.checkpoint_path and _checkpoint_path()),
                     ("lora_checkpoint_path", FLAGS.lora_checkpoint_path and _resolve(FLAGS.lora_checkpoint_path))):
    if path:
      items = layout.items_path_of(path)
      reason = layout.uncommitted_reason(items)
      if reason:
        raise ConversionError(f"{items}: not a committed checkpoint: {reason}; pass --allow_uncommitted to read it"
                              f" anyway (--{flag})")


def _refuse_misused_flags() -> None:
  """Flags that do not apply to the run asked for, refused before anything is read."""
  if FLAGS.direction == "to_huggingface":
    ignored = [f"--{name}" for name in _TO_MAXTEXT_ONLY if FLAGS[name].present]
    if ignored:
      raise app.UsageError(f"{', '.join(ignored)} {'applies' if len(ignored) == 1 else 'apply'} to"
                           " --direction=to_maxtext only")
    if FLAGS.dry_run and FLAGS.verify:
      raise app.UsageError("--dry_run writes nothing for --verify to read")
    if FLAGS.verify and (is_hub(FLAGS.output_dir) or FLAGS.export == "lora_adapter"):
      raise app.UsageError("--verify re-reads a model written to a disk or gs://: not a Hub push (hf://; verify a"
                           " local copy, then push it) nor --export=lora_adapter")
  elif FLAGS["export"].present:
    raise app.UsageError("--export applies to --direction=to_huggingface only")
  elif FLAGS["step"].present and not FLAGS.checkpoint_path:
    raise app.UsageError("--step selects a step of --checkpoint_path's run directory")
  elif is_hub(FLAGS.output_dir) or FLAGS["hub_private"].present:
    raise app.UsageError("--output_dir=hf://... (and --hub_private) are the way back's (--direction=to_huggingface):"
                         " a MaxText checkpoint is written to a disk or gs://")
  elif not FLAGS.checkpoint_path and (FLAGS["lora_alpha"].present or FLAGS["lora_checkpoint_path"].present):
    raise app.UsageError("--lora_checkpoint_path and --lora_alpha merge a MaxText LoRA checkpoint into a MaxText"
                         " checkpoint (--checkpoint_path); a PEFT adapter merges through --lora_adapter_path")
  elif not FLAGS.checkpoint_path and (FLAGS["family"].present or FLAGS["hf_config_path"].present):
    raise app.UsageError("--family and --hf_config_path apply to a MaxText checkpoint (--checkpoint_path) only")


def run() -> None:
  if FLAGS.inspect:
    from converter.reverse import inspection  # pylint: disable=g-import-not-at-top

    print(inspection.describe_checkpoint(FLAGS.checkpoint_path, FLAGS.step, step_given=FLAGS["step"].present))
    return
  _refuse_misused_flags()
  _refuse_uncommitted()
  if FLAGS.direction == "to_huggingface":
    _run_to_huggingface()
  elif FLAGS.lora_adapter_only:
    _write_lora_checkpoint()
  elif FLAGS.dry_run:
    # Several processes' devices simulated in this one, so that the shares come out as the real run's.
    _start_jax(FLAGS.simulated_cpu_devices_count * FLAGS.num_processes)
    _dry_run()
  else:
    from converter import conversion  # pylint: disable=g-import-not-at-top

    start = time.monotonic()
    plan = early_reads = None
    if not _several_processes():
      # Planned before JAX and Orbax load (over half a second): a bad input fails at once, and the first bytes
      # are on their way, and the first blocks read on the idle core, while they load. (Several processes join
      # first and read their own shares; a resumed save skips the blocks it has.)
      plan = _plan()
      conversion.read_ahead(plan, FLAGS.max_inflight_bytes)
      if FLAGS.lazy_load_tensors and not FLAGS.resume:
        early_reads = conversion.read_early(plan, _save_options())
    _start_jax(FLAGS.simulated_cpu_devices_count, distributed=True)
    _run_to_maxtext(plan or _plan(), start, early_reads)


def _plan() -> Plan:
  """What --direction=to_maxtext writes: --hf_model_path converted, or --checkpoint_path laid out again."""
  if FLAGS.checkpoint_path:
    from converter.planning import relayout  # pylint: disable=g-import-not-at-top

    return relayout.plan_relayout(
        _checkpoint_path(), _plan_options(), family=FLAGS.family,
        hf_config_path=_model_path(FLAGS.hf_config_path) if FLAGS.hf_config_path else None,
        lora_checkpoint_path=_resolve(FLAGS.lora_checkpoint_path) if FLAGS.lora_checkpoint_path else None,
        lora_alpha=FLAGS.lora_alpha)
  from converter import conversion  # pylint: disable=g-import-not-at-top

  return conversion.plan_conversion(_model_path(FLAGS.hf_model_path), _plan_options())


def _several_processes() -> bool:
  return FLAGS.distributed == "auto" or FLAGS.num_processes > 1


def _plan_options() -> PlanOptions:
  return PlanOptions(scan_layers=FLAGS.scan_layers, save_dtype=FLAGS.save_dtype, target_model=FLAGS.target_model,
                     target_vocab_size=FLAGS.target_vocab_size, allow_unused_tensors=FLAGS.allow_unused_tensors,
                     keep_fp8=FLAGS.keep_fp8, text_only=FLAGS.text_only,
                     lora_adapter_path=_model_path(FLAGS.lora_adapter_path, adapter=True) if FLAGS.lora_adapter_path
                     else None,
                     chunking=ChunkRule(fsdp_max=FLAGS.chunk_fsdp_max, cut=FLAGS.chunk_layout,
                                        target_mesh=parse_mesh(FLAGS.target_mesh) if FLAGS.target_mesh else (),
                                        huggingface_element_order=FLAGS.chunk_element_order == "huggingface",
                                        devices_per_host=FLAGS.target_devices_per_host))


def _save_options() -> SaveOptions:
  return SaveOptions(lazy=FLAGS.lazy_load_tensors, devices=FLAGS.simulated_cpu_devices_count,
                     max_inflight_bytes=FLAGS.max_inflight_bytes, compression=FLAGS.compression == "zstd",
                     zstd_level=FLAGS.zstd_level, checksums=FLAGS.chunk_checksums)


def _run_to_maxtext(plan: Plan, start: float, early_reads: EarlyReads | None = None) -> None:
  from converter import conversion  # pylint: disable=g-import-not-at-top
  from converter.progress import Progress  # pylint: disable=g-import-not-at-top

  _start_up_done()
  progress = Progress(enabled=FLAGS.progress)
  run = _run_context(progress=progress, cancel=_cancel_on_signals(), early_reads=early_reads)
  save_options = _save_options()
  try:
    result = conversion.save_plan(plan, _resolve(FLAGS.output_dir), save_options, run)
  finally:
    progress.close()
  seconds = time.monotonic() - start
  plan = result.plan
  print(f"family:        {plan.family.name} ({plan.config.architecture}), target model {plan.target_model}")
  print(f"leaves:        {len(plan.leaves)} ({'scanned' if plan.scan_layers else 'unscanned'}, {plan.save_dtype.name})")
  if FLAGS.checkpoint_path:
    print(f"source:        MaxText checkpoint {plan.source.location} (params only)")
  if plan.fp8:
    print(f"source:        {plan.source.facts.quant_method} weights, kept as {plan.fp8.weight_dtype} with their"
          f" scales ({plan.fp8.block}-element blocks)")
  elif plan.source.quant_method:
    print(f"source:        {plan.source.quant_method} weights, dequantized while streaming")
  _print_lora(plan)
  _print_hub_reads()
  print(f"bytes:         {plan.total_bytes:,}")
  print(f"seconds:       {seconds:.2f}")
  print(f"peak RSS:      {_peak_rss_bytes() / 2**20:.0f} MiB")
  print(f"devices:       {save_options.devices} ({'lazy' if save_options.lazy else 'eager'})")
  print(f"output:        {result.items_path}")
  if run.resume:
    print(f"resumed:       {result.resumed_blocks} blocks reused from the interrupted run")
  if run.processes.count > 1:
    print(f"process:       {run.processes.index} of {run.processes.count}, wrote {result.written_bytes:,} bytes"
          f" ({result.written_bytes / max(1, plan.total_bytes):.1%} of the checkpoint)")
  for warning in plan.warnings:
    print(f"warning:       {warning}")
  print(f"MaxText:       load_parameters_path={result.items_path} "
        + " ".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in result.overrides.items()))
  if FLAGS.verify:
    _verify(plan, result.items_path, run.processes)


def _print_hub_reads() -> None:
  from converter.storage import hub  # pylint: disable=g-import-not-at-top

  if hub.stats().resolves:
    print(f"hub reads:     {hub.stats().describe()}")


def _write_lora_checkpoint() -> None:
  """--lora_adapter_only: the PEFT adapter as a MaxText LoRA checkpoint."""
  from converter.lora import lora_checkpoint  # pylint: disable=g-import-not-at-top
  from converter.model_config import load_model_config  # pylint: disable=g-import-not-at-top
  from converter.sources import lora  # pylint: disable=g-import-not-at-top

  if not FLAGS.lora_adapter_path:
    raise app.UsageError("--lora_adapter_only needs --lora_adapter_path")
  start = time.monotonic()
  adapter = lora.read_adapter(_model_path(FLAGS.lora_adapter_path, adapter=True))
  config = load_model_config(_model_path(FLAGS.hf_model_path))
  checkpoint = lora_checkpoint.plan_lora_checkpoint(adapter, config, target_model=FLAGS.target_model,
                                                    scan_layers=FLAGS.scan_layers, save_dtype=FLAGS.save_dtype)
  output_dir = _resolve(FLAGS.output_dir)
  _start_jax(1)
  items = lora_checkpoint.write_lora_checkpoint(checkpoint, output_dir)
  print(f"lora:          {checkpoint.modules} modules of {adapter.location} (r {checkpoint.rank}, lora_alpha"
        f" {checkpoint.alpha:g}), {'scanned' if FLAGS.scan_layers else 'unscanned'}, for {checkpoint.target_model}")
  print(f"seconds:       {time.monotonic() - start:.2f}")
  print(f"output:        {items}")
  # MaxText 0.2.5's SFT applies LoRA before it reads the checkpoint's metadata: rank and alpha must be passed too.
  print(f"MaxText:       lora.enable_lora=true lora.lora_rank={checkpoint.rank} lora.lora_alpha={checkpoint.alpha:g}"
        f" lora.lora_restore_path={items}")


def _print_lora(plan) -> None:
  """The adapter a conversion merged (--lora_adapter_path, or --lora_checkpoint_path into a MaxText checkpoint), as
  its record keeps it."""
  lora = plan.source.facts.lora_adapter
  if FLAGS.lora_checkpoint_path:
    print(f"lora:          {len(lora['modules'])} modules merged, r {lora['r']}, lora_alpha {lora['lora_alpha']:g},"
          f" from {lora['lora_checkpoint_path']}")
  elif FLAGS.lora_adapter_path:
    print(f"lora:          {len(lora['modules'])} modules of {lora['path']} merged (r {lora['r']},"
          f" lora_alpha {lora['lora_alpha']:g}{', rsLoRA' if lora['use_rslora'] else ''}"
          f"{', rank/alpha patterns' if lora['rank_pattern'] or lora['alpha_pattern'] else ''})")


def _start_up_done() -> None:
  """Moves every object start-up made (modules, JAX, Orbax: hundreds of thousands) out of the collector's sight,
  then lets it run: collections during a conversion then walk only what the conversion allocates (they were 2%
  of the samples of a conversion, and a tenth of the imports' time with the collector on)."""
  gc.freeze()
  gc.enable()


def _cancel_on_signals() -> threading.Event:
  """SIGINT/SIGTERM stop the save before its next block, so it fails and never commits (Orbax's background
  thread would otherwise finish and commit the checkpoint after the main thread is gone)."""
  cancel = threading.Event()

  def stop(signum, frame):
    del frame
    if cancel.is_set():
      raise KeyboardInterrupt
    cancel.set()
    print(f"\n{signal.Signals(signum).name}: stopping after the blocks in flight (again to abort)", file=sys.stderr)

  for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, stop)
  return cancel


def _dry_run() -> None:
  import psutil  # pylint: disable=g-import-not-at-top
  from converter import conversion, dry_run  # pylint: disable=g-import-not-at-top
  from converter.output.maxtext import MaxTextOutput  # pylint: disable=g-import-not-at-top

  _start_up_done()
  plan = _plan()
  shares = None
  if FLAGS.num_processes > 1:
    import jax  # pylint: disable=g-import-not-at-top
    from converter.planning.lazy_leaves import lazy_tree  # pylint: disable=g-import-not-at-top
    from handlers import LazyTensor, Processes  # pylint: disable=g-import-not-at-top
    from handlers.streaming import share_bytes  # pylint: disable=g-import-not-at-top

    tree = lazy_tree(plan, lazy=True, devices=len(jax.devices()), processes=Processes())
    values = [v for v in jax.tree.leaves(tree) if isinstance(v, LazyTensor)]
    shares = share_bytes(values, FLAGS.max_inflight_bytes, FLAGS.num_processes)
  print(dry_run.describe(plan, baseline_bytes=psutil.Process().memory_info().rss,
                         max_inflight_bytes=FLAGS.max_inflight_bytes, shares=shares))
  output = MaxTextOutput(_resolve(FLAGS.output_dir), RunContext())
  if output.has_checkpoint() and not FLAGS.overwrite:
    print(f"warning: {output.step_path} already holds a checkpoint; the conversion will refuse it without"
          " --overwrite")


def _verify(plan, items_path: str, processes) -> None:
  from converter.errors import ConversionError  # pylint: disable=g-import-not-at-top
  from converter.progress import Progress  # pylint: disable=g-import-not-at-top
  from converter.verify import verify_checkpoint  # pylint: disable=g-import-not-at-top

  progress = Progress(enabled=FLAGS.progress, description="verifying")
  progress.start(plan.total_bytes)
  report = verify_checkpoint(plan, items_path, on_block=progress.advance, processes=processes,
                             max_inflight_bytes=FLAGS.max_inflight_bytes)
  progress.close()
  print(f"verified:      {report.leaves} leaves, {report.blocks} blocks, {report.bytes:,} bytes,"
        f" {len(report.mismatches)} mismatches")
  for mismatch in report.mismatches:
    print(f"mismatch:      {mismatch}")
  if report.mismatches:
    raise ConversionError(f"{items_path}: --verify found {len(report.mismatches)} leaves that differ from the source")


def _usage_error(reason: str) -> NoReturn:
  """A misused flag: its reason in one line and where help is, instead of absl's usage (170 lines) before it."""
  print(f"error: {' '.join(reason.split())} (see --help)", file=sys.stderr)
  sys.exit(1)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's parsing, its errors (an unknown flag, a bad value, a validator's refusal) as `_usage_error`s."""
  try:
    return FLAGS(argv)
  except flags.Error as e:
    reason = str(e)
    if reason.startswith("flags ") and ": --" in reason:  # A multi-flag validator's: every value, then the reason.
      reason = reason[reason.index(": --") + 2:]
    _usage_error(reason.removeprefix("flag "))


def main(argv: list[str]) -> None:
  try:
    _main(argv)
  except app.UsageError as e:
    _usage_error(str(e))


def _main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  gc.disable()  # Until start-up is done (_start_up_done): imports only add objects that live as long as we do.
  relayout = FLAGS.direction == "to_maxtext" and FLAGS.checkpoint_path
  malloc.configure(malloc.RELAYOUT_MMAP_THRESHOLD_BYTES if relayout else malloc.MMAP_THRESHOLD_BYTES)
  from converter import storage  # pylint: disable=g-import-not-at-top
  from converter.storage import scratch  # pylint: disable=g-import-not-at-top

  storage.configure_emulator()  # Before tensorstore or gcsfs read their settings.
  storage.set_request_retries(FLAGS.storage_retries)
  storage.hub.configure(download_first=FLAGS.hub_download_first, connections=FLAGS.hub_connections)
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # Orbax logs every step at INFO; -v=0 brings it back.
    logging.get_absl_handler().addFilter(library_logs.drop_library_tracebacks)
  scratch.sweep()  # What killed runs left in TMPDIR (a Hub push's staged shards), logged at INFO.
  from converter.errors import ConversionError  # pylint: disable=g-import-not-at-top

  try:
    if _several_processes() and not FLAGS.dry_run:
      from converter import processes  # pylint: disable=g-import-not-at-top

      with processes.gloo_lines_dropped():
        run()
    else:
      run()
  except ConversionError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
