"""Interop check against real MaxText 0.2.5: our converted checkpoints, MaxText's loader and forward pass.

For every tiny model in tools/tiny_models.TINY_MODELS that names a MaxText 0.2.5 model config (`maxtext_model`),
scan on and off:
  1. build the random tiny transformers model (float32; tied models get bf16-representable embedding tables,
     since MaxText's tied logits use a bfloat16 copy of the table) and its transformers reference logits;
  2. convert it with the real converter (`converter/main.py --save_dtype=float32 --target_model=<name>`);
  3. run `maxtext_logits.py` under MaxText's Python 3.12 venv with exactly the overrides the converter recorded in
     OUT/0/_CHECKPOINT_METADATA (custom_metadata.hf2maxtext.maxtext_overrides) -- the harness adds only run-time
     settings (cpu, float32, dot_product attention, batch and sequence length), refuses any difference from the
     tree MaxText's NNX loader restores (non-Param weights such as DeepSeek V3's MoEBiasVar gate bias included),
     loads with MaxText's `from_pretrained` and calls the NNX model it returns; its log must hold no Orbax
     warning about the checkpoint's handler (`handler_warnings`);
  4. compare: max|diff| <= --atol (1e-3) and argmax agreement 100%.
Prints one row per case and finally exactly one line `N passed, N failed`; exits 1 on any failure.

  integration_tests/maxtext_interop/setup_venv.sh   # .mtvenv (Python 3.12, maxtext==0.2.5), once
  PYTHONPATH=. .venv/bin/python integration_tests/maxtext_interop/run_interop.py [--families=qwen3,gemma2]
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

from converter.checkpoint_format.record import ConversionRecord  # noqa: E402
from tools.testing.reused_process import ReusedProcess  # noqa: E402

FLAGS = flags.FLAGS

flags.DEFINE_string(
    "maxtext_python",
    os.environ.get("HF2MAXTEXT_MAXTEXT_PYTHON") or os.path.join(ROOT, ".mtvenv", "bin", "python"),
    "Python 3.12 interpreter with maxtext==0.2.5 (setup_venv.sh builds .mtvenv). Default: $HF2MAXTEXT_MAXTEXT_PYTHON"
    " or .mtvenv/bin/python in the repository root.",
)
flags.DEFINE_list("families", [], "Tiny models (TINY_MODELS keys) to run; default: every registered one.")
flags.DEFINE_enum("scan_layers", "both", ["both", "true", "false"], "Scan settings to run.")
flags.DEFINE_float("atol", 1e-3, "Largest max|maxtext - transformers| logit difference that passes.")
flags.DEFINE_integer("batch", 2, "Token-id batch size.")
flags.DEFINE_integer("seq_len", 32, "Token-id sequence length: longer than the tiny models' sliding windows (Gemma 8,"
                     " GPT-OSS 4), Llama 4's attention chunk (4) and DeepSeek V3.2's indexer top-k (4), so that"
                     " all of them take effect.")
flags.DEFINE_integer("seed", 0, "Seed for the tiny models and the token ids.")
flags.DEFINE_list("multiprocess_families", ["qwen3", "qwen3_moe"], "Tiny models also converted by two processes"
                  " (--num_processes=2 on 127.0.0.1, scan on) and loaded by MaxText the same way.")
flags.DEFINE_list("target_mesh_families", ["qwen3_moe"], "Tiny models also converted with --target_mesh (chunks"
                  " stored inside the write blocks at that mesh's shards; scan on) and loaded by MaxText the same way.")
flags.DEFINE_string("target_mesh", "fsdp=4,tensor=2,expert=2", "The --target_mesh of those cases.")
flags.DEFINE_list("lora_families", ["qwen3"], "Tiny models also converted with a random PEFT LoRA adapter merged"
                  " (--lora_adapter_path; scan on), against transformers' logits with peft's merge of it; and given"
                  " MaxText's own LoRA (maxtext_lora.py), whose saved factors, exported as a PEFT adapter"
                  " (--export=lora_adapter), must give MaxText's LoRA logits in peft; and the adapter converted alone"
                  " (--lora_adapter_only), restored by MaxText's LoRA (lora.lora_restore_path), must give peft's"
                  " logits with it unmerged.")
flags.DEFINE_list("sft_families", ["qwen3"], "Tiny models also trained two steps by MaxText's own SFT trainer"
                  " (train_sft_native, synthetic data) from their converted checkpoint (scan on), whose checkpoint"
                  " converted back to HuggingFace must give MaxText's logits on it in transformers.")
flags.DEFINE_list("tunix_sft_families", ["qwen3"], "Tiny models also trained two steps by MaxText's Tunix-based SFT"
                  " trainer (train_sft: Tunix's PeftTrainer, a tiny pre-tokenized Megatron mmap file) from their"
                  " converted checkpoint (scan on), whose Tunix checkpoint (<step>/model_params, an NNX state)"
                  " converted back to HuggingFace must give MaxText's logits on it in transformers.")
flags.DEFINE_list("relayout_families", ["qwen3_5_fp8"], "Tiny models also converted (scan on, the row's flags:"
                  " --keep_fp8 for qwen3_5_fp8) and laid out again by --checkpoint_path (MaxText -> MaxText, scan"
                  " off): MaxText loads the re-laid checkpoint, its FP8 kernels and scales as stored.")
flags.DEFINE_list("damaged_families", ["qwen3"], "Tiny models also converted (scan on) and then damaged, one bit"
                  " flipped in one stored chunk: MaxText's loader must refuse them (the chunk's checksum).")
flags.DEFINE_integer("jobs", 2, "Cases (convert + MaxText forward) run at once.")
flags.DEFINE_integer("case_timeout_s", 600, "Timeout for each subprocess.")
flags.DEFINE_string("work_dir", None, "Where models, checkpoints and logs go (default: a temporary directory).")
flags.DEFINE_boolean("keep_work_dir", False, "Keep the temporary work directory.")
flags.DEFINE_string("results_page", None, "Also write the multimodal rows' figures as a Markdown page here (e.g."
                    " docs/multimodal-results.md): what docs/multimodal.md quotes.")

HARNESS = os.path.join(ROOT, "integration_tests", "maxtext_interop", "maxtext_logits.py")
LORA_HARNESS = os.path.join(ROOT, "integration_tests", "maxtext_interop", "maxtext_lora.py")
CONVERTER = os.path.join(ROOT, "converter", "main.py")


@dataclasses.dataclass
class Case:
  model: str
  maxtext_model: str
  scan: bool
  hf_dir: str
  ids_path: str
  reference: np.ndarray
  work: str
  max_diff: float = float("nan")
  argmax: float = float("nan")
  error: str = ""
  seconds: float = 0.0
  processes: int = 1
  multimodal: bool = False  # ids_path is a multimodal case .npz (tools/multimodal_inputs).
  align: tuple[str, ...] = ()
  shipped_floor: float = 0.0
  shipped_diff: float = float("nan")  # As shipped, where the check holds the aligned forward to --atol.
  converter_flags: tuple[str, ...] = ()  # Beyond the row's own (--target_mesh cases).
  # MaxText's own LoRA (maxtext_lora.py) on the converted checkpoint, its saved factors exported as a PEFT adapter
  # (--export=lora_adapter): the reference is then transformers with that adapter in peft.
  lora_export: bool = False
  # A PEFT adapter converted alone (--lora_adapter_only) into a MaxText LoRA checkpoint, which MaxText's LoRA
  # restores (lora.lora_restore_path) onto the converted base: the reference is transformers with it in peft.
  lora_restore: str = ""
  # MaxText's own SFT trainer (train_sft_native, 2 steps on synthetic data) run from the converted checkpoint; its
  # checkpoint (a TrainState: params, opt_state, NNX auxiliaries) converted back: MaxText's logits on the trained
  # checkpoint against transformers' on the HF model it becomes.
  sft: bool = False
  # The same with MaxText's Tunix-based SFT trainer (train_sft), whose checkpoint is Tunix's: an NNX state.
  tunix_sft: bool = False
  # One bit of one stored chunk flipped after the conversion: MaxText's load must fail on the chunk's checksum.
  damaged: bool = False
  # The conversion laid out again with the other scan setting (--checkpoint_path), which MaxText then loads.
  relayout: bool = False

  @property
  def passed(self) -> bool:
    return not self.error

  @property
  def name(self) -> str:
    return (f"{self.model} scan={'on' if self.scan else 'off'}" + (f" x{self.processes}" if self.processes > 1 else "")
            + "".join(f" {flag}" for flag in self.converter_flags) + (" relaid" if self.relayout else ""))


def _tail(path: str, lines: int = 15) -> str:
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      return "".join(f.readlines()[-lines:])
  except OSError:
    return ""


def _run(cmd: list[str], log: str, env: dict) -> int:
  with open(log, "w", encoding="utf-8") as out:
    out.write("$ " + " ".join(cmd) + "\n")
    out.flush()
    try:
      return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                            timeout=FLAGS.case_timeout_s, check=False).returncode
    except subprocess.TimeoutExpired:
      out.write(f"\n[run_interop] timed out after {FLAGS.case_timeout_s}s\n")
      return 124


_idle_workers: "queue.SimpleQueue[ReusedProcess]" = queue.SimpleQueue()
_all_workers: list[ReusedProcess] = []

# transformers changes process-wide state while it builds or loads a model: `from_pretrained` swaps
# `PreTrainedModel.tie_weights` and torch's init functions for no-ops and sets torch's default dtype until it
# returns. The main thread builds the next tiny models while the pool's LoRA-export cases load one with peft, so
# a model built meanwhile came out untied (a Gemma 4 saved with its own lm_head, another's reference untied):
# every use of transformers here holds this lock.
_TRANSFORMERS = threading.Lock()


def _run_maxtext(args: list[str], log: str) -> int:
  """maxtext_logits.py with `args`, in a reused MaxText process (one per job). A case that fails there runs again
  as a process of its own, whose verdict and log stand: a failure is never an artefact of the reuse."""
  try:
    worker = _idle_workers.get_nowait()
  except queue.Empty:
    worker = ReusedProcess(lambda fd: [FLAGS.maxtext_python, HARNESS, f"--serve={fd}"], _maxtext_env(), cwd=ROOT)
    _all_workers.append(worker)
  with open(log, "w", encoding="utf-8") as out:
    out.write(f"$ {HARNESS} {' '.join(args)}  (in a reused MaxText process)\n")
  answer = worker.request({"argv": args, "log": log}, FLAGS.case_timeout_s)
  if worker.alive:
    _idle_workers.put(worker)
  if answer is not None and answer["returncode"] == 0:
    return 0
  return _run([FLAGS.maxtext_python, HARNESS, *args], log, _maxtext_env())


def _converter_env() -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
  env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
  return env


_scratch: str | None = None  # Inside the work directory: whatever MaxText leaves there goes with it.


# XLA's CPU backend compiles MaxText's tiny programs without LLVM's costly optimisations: on a cold JAX cache
# (a new machine, a contributor's first run) compiling is most of each case's time, and these programs run once,
# on a few tokens. The cases still compare MaxText's logits with transformers' at the same bounds (testing.md).
MAXTEXT_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def _maxtext_env(*xla_flags: str) -> dict:
  """A clean interpreter (nothing from the 3.11 environment on its path) on the CPU, with `xla_flags` added to
  MAXTEXT_XLA_FLAGS."""
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
  env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2", XLA_FLAGS=" ".join((MAXTEXT_XLA_FLAGS, *xla_flags)))
  if _scratch:
    env["TMPDIR"] = _scratch
  return env


def recorded_overrides(out_dir: str) -> tuple[dict, str]:
  record = ConversionRecord.read(os.path.join(out_dir, "0", "items"))
  if record.maxtext_overrides is None:
    raise RuntimeError("the checkpoint's custom_metadata records no hf2maxtext.maxtext_overrides")
  return record.maxtext_overrides, record.target_model or ""


# A warning line as Python's logging (absl not initialised: "WARNING:absl:...") or absl ("W1203 12:00:00.0 ...")
# writes it.
_WARNING_LINE = re.compile(r"^(WARNING:|W\d{4} )")
_ABOUT_HANDLERS = re.compile(r"handler|typestr", re.IGNORECASE)


def handler_warnings(log_text: str) -> list[str]:
  """Lines of a MaxText log that warn about the checkpoint's handler, or name one of our classes at all.

  Orbax resolves a checkpointable's handler from the typestr the save recorded (`item_handlers` in
  OUT/0/_CHECKPOINT_METADATA); a typestr naming our own handler, which a training job cannot import, made
  MaxText 0.2.5 log "No handler found for typestr ..." and "Failed to resolve handler ..." on every load. A
  checkpoint we write must load as silently as one Orbax wrote itself.
  """
  return [line for line in log_text.splitlines()
          if (_WARNING_LINE.match(line) and _ABOUT_HANDLERS.search(line)) or "LazyTensor" in line]


def run_case(case: Case) -> Case:
  from tools import validate_lib  # pylint: disable=g-import-not-at-top
  from tools.testing import tiny_models

  start = time.monotonic()
  os.makedirs(case.work, exist_ok=True)
  out_dir = os.path.join(case.work, "ckpt")
  try:
    command = [sys.executable, CONVERTER, f"--hf_model_path={case.hf_dir}", f"--output_dir={out_dir}",
               "--save_dtype=float32", "--simulated_cpu_devices_count=1", f"--scan_layers={str(case.scan).lower()}",
               f"--target_model={case.maxtext_model}", *tiny_models.TINY_MODELS[case.model].converter_flags,
               *case.converter_flags]
    rc = (_run(command, os.path.join(case.work, "convert.log"), _converter_env()) if case.processes == 1
          else _run_processes(command, case.processes, os.path.join(case.work, "convert.log")))
    if rc != 0:
      case.error = f"converter exited {rc}:\n{_tail(os.path.join(case.work, 'convert.log'))}"
      return case
    if case.relayout:
      relaid = os.path.join(case.work, "relaid")
      rc = _run([sys.executable, CONVERTER, f"--checkpoint_path={os.path.join(out_dir, '0', 'items')}",
                 f"--output_dir={relaid}", f"--scan_layers={str(not case.scan).lower()}", "--save_dtype=float32",
                 "--simulated_cpu_devices_count=1"], os.path.join(case.work, "relayout.log"), _converter_env())
      if rc != 0:
        case.error = f"the re-layout exited {rc}:\n{_tail(os.path.join(case.work, 'relayout.log'))}"
        return case
      out_dir = relaid
    overrides, target = recorded_overrides(out_dir)
    if target != case.maxtext_model:
      case.error = f"checkpoint records target_model={target!r}, not {case.maxtext_model!r}"
      return case
    overrides_path = os.path.join(case.work, "overrides.json")
    with open(overrides_path, "w", encoding="utf-8") as f:
      json.dump(overrides, f, indent=1, sort_keys=True)
    logits_path = os.path.join(case.work, "maxtext_logits.npy")
    log = os.path.join(case.work, "maxtext.log")
    aligned_path = os.path.join(case.work, "maxtext_logits_aligned.npy")
    inputs = ([f"--inputs={case.ids_path}"] + ([f"--align={','.join(case.align)}", f"--aligned_output={aligned_path}"]
                                               if case.align else [])
              if case.multimodal else [f"--token_ids={case.ids_path}"])
    if case.damaged:
      _damage_one_chunk(os.path.join(out_dir, "0", "items"))
    if case.lora_export:
      rc = _maxtext_lora_export(case, out_dir, overrides_path, logits_path, log)
    elif case.lora_restore:
      rc = _maxtext_lora_restore(case, out_dir, overrides_path, logits_path, log)
    elif case.sft or case.tunix_sft:
      rc = _maxtext_sft(case, out_dir, overrides, overrides_path, logits_path, log)
    else:
      rc = _run_maxtext([f"--checkpoint={os.path.join(out_dir, '0', 'items')}", f"--model_name={case.maxtext_model}",
                         f"--overrides=@{overrides_path}", *inputs, f"--output={logits_path}"], log)
    if case.damaged:
      with open(log, encoding="utf-8", errors="replace") as f:
        refused = rc not in (0, 124) and re.search(r"doesn't match checksum|Digest mismatch", f.read()) is not None
      case.error = "" if refused else (f"MaxText's load did not fail on the damaged chunk's checksum (exit {rc}):\n"
                                       f"{_tail(log)}")
      return case
    if rc != 0:
      why = {3: "parameter tree differs from MaxText's", 124: "timed out"}.get(rc, f"maxtext_logits.py exited {rc}")
      case.error = f"{why}:\n{_tail(log, 40 if rc == 3 else 15)}"
      return case
    with open(log, encoding="utf-8", errors="replace") as f:
      leaks = handler_warnings(f.read())
    if leaks:
      case.error = "MaxText's load logged Orbax handler warnings:\n" + "\n".join(line[:300] for line in leaks)
      return case
    logits = np.load(logits_path)
    if logits.shape[:-1] != case.reference.shape[:-1] or logits.shape[-1] < case.reference.shape[-1]:
      case.error = f"MaxText logits {logits.shape} vs reference {case.reference.shape}"
      return case
    if not np.isfinite(logits[..., : case.reference.shape[-1]]).all():
      case.error = "MaxText logits are not finite"
      return case
    problems = []
    if case.align:  # Held to --atol: the aligned forward; as shipped: MaxText's own floor.
      case.shipped_diff, _, _ = validate_lib.compare_logits(logits, case.reference)
      if not case.shipped_diff <= max(FLAGS.atol, 1.25 * case.shipped_floor):
        problems.append(f"as shipped max|diff| {case.shipped_diff:.3g} > 1.25 x MaxText's floor"
                        f" {case.shipped_floor:g}")
      logits = np.load(aligned_path)
    case.max_diff, _, case.argmax = validate_lib.compare_logits(logits, case.reference)
    if not case.max_diff <= FLAGS.atol:
      problems.append(f"max|diff| {case.max_diff:.3g} > {FLAGS.atol:g}")
    if case.argmax < 1.0:
      problems.append(f"argmax agreement {case.argmax:.2%} < 100%")
    case.error = "; ".join(problems)
    return case
  except Exception as e:  # pylint: disable=broad-except
    case.error = f"{type(e).__name__}: {e}"
    return case
  finally:
    case.seconds = time.monotonic() - start


def _damage_one_chunk(items: str) -> None:
  """Flips one bit inside the first stored chunk of the MLP's output kernel, as a disk or bucket might."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top

  store = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{items}/"}).result()
  key = next(k for k in store.list().result() if b".mlp.wo.kernel/c/" in k)
  stored = bytearray(store.read(key).result().value)
  stored[len(stored) // 4] ^= 0x10  # In the chunks' bytes; the shard index is at the end.
  store.write(key, bytes(stored)).result()


def _maxtext_lora_export(case: Case, out_dir: str, overrides_path: str, logits_path: str, log: str) -> int:
  """MaxText's LoRA on the checkpoint (random factors, saved by MaxText's own checkpointing, its logits to
  `logits_path`), exported by the converter as a PEFT adapter (`case.reference` becomes peft's logits with it) and
  merged with the base back to one HF model, whose transformers logits must be MaxText's LoRA logits too."""
  from tools import lora_adapters, validate_lib  # pylint: disable=g-import-not-at-top

  lora_dir, adapter = os.path.join(case.work, "maxtext_lora"), os.path.join(case.work, "peft_adapter")
  rc = _run([FLAGS.maxtext_python, LORA_HARNESS, f"--checkpoint={os.path.join(out_dir, '0', 'items')}",
             f"--model_name={case.maxtext_model}", f"--overrides=@{overrides_path}", f"--token_ids={case.ids_path}",
             f"--output={logits_path}", f"--lora_output={lora_dir}"], log, _maxtext_env())
  if rc == 0:
    rc = _run([sys.executable, CONVERTER, "--direction=to_huggingface", "--export=lora_adapter",
               f"--checkpoint_path={os.path.join(lora_dir, '0', 'items')}", f"--hf_config_path={case.hf_dir}",
               f"--output_dir={adapter}"], os.path.join(case.work, "export.log"), _converter_env())
  merged = os.path.join(case.work, "merged_hf")
  if rc == 0:  # Merged mode back: the base and MaxText's LoRA checkpoint as one HF model.
    rc = _run([sys.executable, CONVERTER, "--direction=to_huggingface",
               f"--checkpoint_path={os.path.join(out_dir, '0', 'items')}",
               f"--lora_checkpoint_path={os.path.join(lora_dir, '0', 'items')}", f"--output_dir={merged}"],
              os.path.join(case.work, "merged.log"), _converter_env())
  merged_maxtext = os.path.join(case.work, "merged_maxtext")
  merged_maxtext_logits = os.path.join(case.work, "merged_maxtext_logits.npy")
  if rc == 0:  # The same merge into one MaxText checkpoint (--direction=to_maxtext), run by MaxText without LoRA.
    rc = _run([sys.executable, CONVERTER, f"--checkpoint_path={os.path.join(out_dir, '0', 'items')}",
               f"--lora_checkpoint_path={os.path.join(lora_dir, '0', 'items')}", f"--output_dir={merged_maxtext}",
               "--save_dtype=float32", "--simulated_cpu_devices_count=1"],
              os.path.join(case.work, "merged_maxtext.log"), _converter_env())
  if rc == 0:
    rc = _run_maxtext([f"--checkpoint={os.path.join(merged_maxtext, '0', 'items')}",
                       f"--model_name={case.maxtext_model}", f"--overrides=@{overrides_path}",
                       f"--token_ids={case.ids_path}", f"--output={merged_maxtext_logits}"],
                      os.path.join(case.work, "merged_maxtext_logits.log"))
  if rc == 0:
    diff, _, agree = validate_lib.compare_logits(np.load(logits_path), np.load(merged_maxtext_logits))
    print(f"  {case.name}: MaxText on the base with MaxText's LoRA merged in (--direction=to_maxtext) vs MaxText's"
          f" LoRA forward: max|diff| {diff:.2e}")
    if diff > FLAGS.atol or agree < 1.0:
      raise RuntimeError(f"MaxText on the merged MaxText checkpoint vs its LoRA forward: max|diff| {diff:.3g},"
                         f" argmax {agree:.2%}")
  if rc == 0:
    base = case.reference
    ids = np.load(case.ids_path)
    with _TRANSFORMERS:
      case.reference = lora_adapters.merged_logits(case.hf_dir, adapter, ids, merge=False)
      merged_logits = validate_lib.reference_logits(merged, ids)
    if validate_lib.compare_logits(case.reference, base)[0] < 0.1:
      raise RuntimeError("the LoRA factors do not move the logits: the check could not tell a dropped adapter")
    diff, _, agree = validate_lib.compare_logits(np.load(logits_path), merged_logits)
    if diff > FLAGS.atol or agree < 1.0:
      raise RuntimeError(f"transformers on the merged model (--lora_checkpoint_path) vs MaxText's LoRA forward:"
                         f" max|diff| {diff:.3g}, argmax {agree:.2%}")
  return rc


def _maxtext_lora_restore(case: Case, out_dir: str, overrides_path: str, logits_path: str, log: str) -> int:
  """The case's PEFT adapter converted alone into a MaxText LoRA checkpoint, restored by MaxText's LoRA onto the
  base (its logits to `logits_path`)."""
  lora_dir = os.path.join(case.work, "lora_checkpoint")
  rc = _run([sys.executable, CONVERTER, f"--hf_model_path={case.hf_dir}", f"--lora_adapter_path={case.lora_restore}",
             "--lora_adapter_only", f"--scan_layers={str(case.scan).lower()}", "--save_dtype=float32",
             f"--output_dir={lora_dir}"], os.path.join(case.work, "adapter.log"), _converter_env())
  if rc == 0:
    rc = _run([FLAGS.maxtext_python, LORA_HARNESS, f"--checkpoint={os.path.join(out_dir, '0', 'items')}",
               f"--model_name={case.maxtext_model}", f"--overrides=@{overrides_path}", f"--token_ids={case.ids_path}",
               f"--output={logits_path}", f"--lora_restore_path={os.path.join(lora_dir, '0', 'items')}"], log,
              _maxtext_env())
  return rc


def _write_mmap_tokens(prefix: str, vocab_size: int, seed: int) -> None:
  """A tiny pre-tokenized corpus in Megatron's indexed format (`prefix`.bin + .idx: MMIDIDX, version 1, int32
  tokens; each document ends with the EOD id 0), which MaxText's grain pipeline reads without a tokenizer
  (grain_file_type=mmap). MaxText 0.2.5's synthetic data does not run under train_sft: its generator is jitted with
  the config as a static argument, and train_sft's pydantic config is not hashable."""
  import struct  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(seed)
  docs = [np.append(rng.integers(1, vocab_size, size=39), 0).astype(np.int32) for _ in range(8)]
  with open(prefix + ".bin", "wb") as f:
    for doc in docs:
      f.write(doc.tobytes())
  sizes = np.array([len(d) for d in docs], np.int32)
  pointers = np.concatenate([[0], np.cumsum(sizes[:-1]) * 4]).astype(np.int64)
  with open(prefix + ".idx", "wb") as f:
    f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 4, len(docs), len(docs)))
    f.write(sizes.tobytes() + pointers.tobytes() + np.arange(len(docs) + 1, dtype=np.int64).tobytes())


def _maxtext_sft(case: Case, out_dir: str, overrides: dict, overrides_path: str, logits_path: str, log: str) -> int:
  """Two steps of MaxText's SFT trainer (native, or with `case.tunix_sft` the Tunix-based one) from the converted
  checkpoint; its last checkpoint converted back to HuggingFace (`case.reference` becomes transformers' logits on
  it) and run by MaxText (`logits_path`)."""
  from tools import validate_lib  # pylint: disable=g-import-not-at-top

  package = subprocess.run([FLAGS.maxtext_python, "-c", "import maxtext, os; print(os.path.dirname(maxtext.__file__))"],
                           capture_output=True, text=True, env=_maxtext_env(), check=True).stdout.strip()
  run_dir = os.path.join(case.work, "sft")
  settings = [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in overrides.items()]
  if case.tunix_sft:
    os.makedirs(run_dir, exist_ok=True)
    tokens = os.path.join(run_dir, "tokens")
    _write_mmap_tokens(tokens, int(overrides["vocab_size"]), FLAGS.seed)
    trainer = "train_sft"
    data = ["dataset_type=grain", "grain_file_type=mmap", f"grain_train_files={tokens}", "grain_worker_count=0",
            "enable_data_shuffling=False"]
    # Tunix's CheckpointManager: <root>/<step>/model_params (nnx.state) and optimizer_state; the last step is 2.
    # The converter is given the step directory and finds model_params itself; MaxText loads model_params.
    trained_step = os.path.join(run_dir, "sft", "checkpoints", "2")
    trained = os.path.join(trained_step, "model_params")
  else:
    trainer = "train_sft_native"
    data = ["dataset_type=synthetic"]
    trained_step = trained = os.path.join(run_dir, "sft", "checkpoints", "1", "items")
  # Native SFT's TrainState is sharded over 4 devices (fsdp), as a trainer on a slice writes one.
  env = _maxtext_env(*([] if case.tunix_sft else ["--xla_force_host_platform_device_count=4"]))
  rc = _run([FLAGS.maxtext_python, "-m", f"maxtext.trainers.post_train.sft.{trainer}",
             os.path.join(package, "configs", "base.yml"), f"model_name={case.maxtext_model}",
             "override_model_config=True", *settings, "run_name=sft", f"base_output_directory={run_dir}",
             f"load_parameters_path={os.path.join(out_dir, '0', 'items')}", "steps=2", "checkpoint_period=1",
             "per_device_batch_size=1", "max_target_length=16", *data, "hardware=cpu",
             "skip_jax_distributed_system=True", "attention=dot_product", "weight_dtype=float32", "dtype=float32",
             "enable_goodput_recording=False",  # MaxText's trainer makes its HLO dump directory even when not dumping.
             f"dump_hlo_local_dir={os.path.join(run_dir, 'xla_dump')}",
             f"jax_cache_dir={os.path.join(run_dir, 'jax_cache')}"],  # Else ~/jax_cache.
            os.path.join(case.work, "sft.log"), env)
  back = os.path.join(case.work, "sft_hf")
  if rc == 0:
    rc = _run([sys.executable, CONVERTER, "--direction=to_huggingface", f"--checkpoint_path={trained_step}",
               f"--hf_config_path={case.hf_dir}", f"--output_dir={back}"], os.path.join(case.work, "back.log"),
              _converter_env())
  if rc == 0:  # MaxText's own checkpoint records none of our metadata (the tree check's logical axes); the tree
    # check reads a params/params tree only, and MaxText's loader reads the NNX one (from_pretrained's NNX branch).
    rc = _run_maxtext([f"--checkpoint={trained}", f"--model_name={case.maxtext_model}", f"--overrides=@{overrides_path}",
                       f"--token_ids={case.ids_path}", f"--output={logits_path}",
                       "--skip_tree_check" if case.tunix_sft else "--allow_tree_mismatch"], log)
  if rc == 0:
    base = case.reference
    with _TRANSFORMERS:
      case.reference = validate_lib.reference_logits(back, np.load(case.ids_path))
    if validate_lib.compare_logits(case.reference, base)[0] < 10 * FLAGS.atol:
      raise RuntimeError("two SFT steps did not move the logits: the check could not tell the base from the trained")
  if rc == 0 and not case.tunix_sft:
    rc = _relaid_train_state(case, trained, overrides, logits_path)
  return rc


def _relaid_train_state(case: Case, trained: str, overrides: dict, logits_path: str) -> int:
  """The trainer's TrainState (fsdp-sharded over its 4 devices, scanned, with its optimizer state) laid out again
  by our converter (--checkpoint_path): unscanned in float32, MaxText's logits on it equal its logits on the
  TrainState; scanned in bfloat16 for fsdp=4, every leaf the TrainState's rounded to bfloat16."""
  from converter.sources import checkpoint_reader  # pylint: disable=g-import-not-at-top
  from converter.sources import maxtext  # pylint: disable=g-import-not-at-top
  from tools import validate_lib  # pylint: disable=g-import-not-at-top

  relaid = {}
  for name, flags in (("unscanned", ["--scan_layers=false", "--save_dtype=float32", "--verify"]),
                      ("mesh", ["--scan_layers=true", "--save_dtype=bfloat16", "--target_mesh=fsdp=4"])):
    relaid[name] = os.path.join(case.work, f"relaid_{name}")
    rc = _run([sys.executable, CONVERTER, f"--checkpoint_path={trained}", f"--hf_config_path={case.hf_dir}",
               f"--output_dir={relaid[name]}", "--simulated_cpu_devices_count=1", *flags],
              os.path.join(case.work, f"relaid_{name}.log"), _converter_env())
    if rc:
      return rc
  unscanned_overrides = os.path.join(case.work, "relaid_overrides.json")
  with open(unscanned_overrides, "w", encoding="utf-8") as f:
    json.dump(dict(overrides, scan_layers=False), f)
  relaid_logits = os.path.join(case.work, "relaid_logits.npy")
  rc = _run_maxtext([f"--checkpoint={os.path.join(relaid['unscanned'], '0', 'items')}",
                     f"--model_name={case.maxtext_model}", f"--overrides=@{unscanned_overrides}",
                     f"--token_ids={case.ids_path}", f"--output={relaid_logits}"],
                    os.path.join(case.work, "relaid_logits.log"))
  if rc:
    return rc
  diff = validate_lib.compare_logits(np.load(relaid_logits), np.load(logits_path))[0]
  print(f"  {case.name}: MaxText on the TrainState laid out unscanned vs on the TrainState: max|diff| {diff:.2e}")
  if not diff <= 1e-5:
    raise RuntimeError(f"MaxText's logits on the re-laid-out TrainState differ from its logits on the TrainState by"
                       f" {diff:.2e}")
  trained_reader = checkpoint_reader.CheckpointReader(trained)
  mesh_items = os.path.join(relaid["mesh"], "0", "items")
  mesh_reader = checkpoint_reader.CheckpointReader(mesh_items)
  expected = maxtext.model_tree(trained_reader.arrays, trained).params
  got = maxtext.model_tree(mesh_reader.arrays, mesh_items).params
  if sorted(got) != sorted(expected):
    raise RuntimeError(f"the re-laid-out TrainState's leaves differ: {sorted(set(got) ^ set(expected))[:5]}")
  for path, array in expected.items():
    want = trained_reader.open(array, (), 1 << 30).read(()).astype(ml_dtypes.bfloat16)
    value = mesh_reader.open(got[path], (), 1 << 30).read(())
    if value.dtype != want.dtype or not np.array_equal(value.view(np.uint16), want.view(np.uint16)):
      raise RuntimeError(f"leaf {'/'.join(path)} laid out in bfloat16 is not the TrainState's rounded")
  return 0


def _run_processes(command: list[str], count: int, log: str) -> int:
  """`command` as `count` processes of one conversion (a coordinator on 127.0.0.1); the first non-zero status."""
  from tools.ports import free_port  # pylint: disable=g-import-not-at-top

  address = f"127.0.0.1:{free_port()}"
  with open(log, "w", encoding="utf-8") as out:
    children = [subprocess.Popen([*command, f"--num_processes={count}", f"--process_id={i}",
                                  f"--coordinator_address={address}"], stdout=out, stderr=subprocess.STDOUT,
                                 env=_converter_env(), cwd=ROOT) for i in range(count)]
    codes = []
    for child in children:
      try:
        codes.append(child.wait(timeout=FLAGS.case_timeout_s))
      except subprocess.TimeoutExpired:
        child.kill()
        codes.append(124)
  return next((c for c in codes if c), 0)


def _is_tied(spec) -> bool:
  import transformers  # pylint: disable=g-import-not-at-top

  return bool(getattr(getattr(transformers, spec.config_class)(**spec.config), "tie_word_embeddings", False))


def write_results_page(path: str, cases: list[Case]) -> None:
  """The multimodal cases as a Markdown table: MaxText 0.2.5's image + text logits against transformers'."""
  lines = [
      "# Multimodal interop results", "",
      "Written by `run_interop.py --results_page` (MaxText 0.2.5's own loader and multimodal forward on one image"
      " (+ audio) and text, float32, against transformers 5.24's float32 logits; tiny random models of"
      " tools/testing/tiny_models.py). \"aligned\": the same load and forward with MaxText's known arithmetic"
      " differences switched to transformers' at trace time (docs/multimodal.md); \"as shipped\": MaxText unchanged, held to"
      " 1.25 x the floor those differences alone cause.", "",
      "| tiny model | MaxText model | scan | max\\|diff\\| (checked) | argmax | as shipped | MaxText's floor | result |",
      "|---|---|---|---|---|---|---|---|",
  ]
  for case in sorted(cases, key=lambda c: (c.model, c.scan)):
    shipped = "same" if np.isnan(case.shipped_diff) else f"{case.shipped_diff:.2e}"
    floor = f"{case.shipped_floor:g}" if case.align else "none"
    lines.append(f"| {case.model} | {case.maxtext_model} | {'on' if case.scan else 'off'} | {case.max_diff:.2e} |"
                 f" {case.argmax:.1%} | {shipped} | {floor} | {'pass' if case.passed else 'FAIL'} |")
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")


def main(argv: list[str]) -> int:
  del argv
  start = time.monotonic()
  import transformers  # pylint: disable=g-import-not-at-top
  from tools import validate_lib  # pylint: disable=g-import-not-at-top
  from tools.testing import tiny_models
  from converter.model_config import load_model_config  # pylint: disable=g-import-not-at-top

  # transformers' save/load progress bars would land between the result rows.
  transformers.utils.logging.disable_progress_bar()

  names = FLAGS.families or list(tiny_models.TINY_MODELS)
  unknown = [n for n in names if n not in tiny_models.TINY_MODELS]
  if unknown:
    raise app.UsageError(f"--families: not in TINY_MODELS: {', '.join(unknown)}")
  scans = {"both": (False, True), "true": (True,), "false": (False,)}[FLAGS.scan_layers]
  runnable = []
  for name in names:
    if tiny_models.TINY_MODELS[name].maxtext_model:
      runnable.append(name)
    else:
      print(f"skip {name}: its TINY_MODELS row names no MaxText model (maxtext_model)", flush=True)

  if not os.path.isfile(FLAGS.maxtext_python) or not os.access(FLAGS.maxtext_python, os.X_OK):
    print(f"error: no MaxText interpreter at {FLAGS.maxtext_python} (run integration_tests/maxtext_interop/"
          "setup_venv.sh, or pass --maxtext_python / set HF2MAXTEXT_MAXTEXT_PYTHON)", flush=True)
    print(f"0 passed, {len(runnable) * len(scans)} failed")
    return 1

  global _scratch
  work = FLAGS.work_dir or tempfile.mkdtemp(prefix="hf2maxtext_interop_")
  _scratch = os.path.join(work, "tmp")
  os.makedirs(_scratch, exist_ok=True)
  print(f"work dir {work}; MaxText python {FLAGS.maxtext_python}; {FLAGS.jobs} job(s)", flush=True)

  cases: list[Case] = []
  futures = []
  lock = threading.Lock()
  header = f"{'model':<20} {'maxtext model':<17} {'scan':<4} {'max|diff|':>10} {'argmax':>8}  {'secs':>5}  result"

  def report(case: Case) -> None:
    with lock:
      diff = "-" if np.isnan(case.max_diff) else f"{case.max_diff:.2e}"
      agree = "-" if np.isnan(case.argmax) else f"{case.argmax:.1%}"
      model = case.model + (f" x{case.processes}" if case.processes > 1 else "") + "".join(
          f" {label}" for prefix, label in (("--target_mesh", "mesh"), ("--lora_adapter_path", "lora"))
          if any(flag.startswith(prefix) for flag in case.converter_flags))
      model += " lora->peft" if case.lora_export else ""
      model += " peft->lora" if case.lora_restore else ""
      model += " sft->hf" if case.sft else ""
      model += " tunix-sft->hf" if case.tunix_sft else ""
      model += " damaged" if case.damaged else ""
      model += " relaid" if case.relayout else ""
      shipped = "" if np.isnan(case.shipped_diff) else f"  (as shipped {case.shipped_diff:.2e}, floor {case.shipped_floor:g})"
      print(f"{model:<20} {case.maxtext_model:<17} {'on' if case.scan else 'off':<4} {diff:>10} {agree:>8}"
            f"  {case.seconds:5.0f}  {'PASS' if case.passed else 'FAIL'}{shipped}", flush=True)
      if case.error:
        print("    " + case.error.rstrip().replace("\n", "\n    "), flush=True)

  print(header, flush=True)
  with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, FLAGS.jobs)) as pool:
    for name in runnable:
      model_dir = os.path.join(work, name)
      hf_dir = os.path.join(model_dir, "hf")
      with _TRANSFORMERS:
        try:
          spec = tiny_models.TINY_MODELS[name]
          tiny_models.build_tiny_model(name, hf_dir, seed=FLAGS.seed, round_embeddings_to_bf16=_is_tied(spec))
          align = ()
          if spec.inputs:  # One image (+ audio) + text, prepared as MaxText's own preprocessing does.
            from tools import multimodal_inputs  # pylint: disable=g-import-not-at-top

            mm_case = multimodal_inputs.make_case(name, hf_dir, FLAGS.seed)
            ids_path = os.path.join(model_dir, "case.npz")
            mm_case.save(ids_path)
            reference, align = mm_case.reference.astype(np.float32), tuple(mm_case.align)
          else:
            ids = validate_lib.token_ids(load_model_config(hf_dir).vocab_size, FLAGS.batch,
                                         spec.seq_len or FLAGS.seq_len, FLAGS.seed)
            ids_path = os.path.join(model_dir, "token_ids.npy")
            np.save(ids_path, ids)
            reference = validate_lib.reference_logits(hf_dir, ids).astype(np.float32)
          np.save(os.path.join(model_dir, "hf_logits.npy"), reference)
        except Exception as e:  # pylint: disable=broad-except
          for scan in scans:
            case = Case(name, tiny_models.TINY_MODELS[name].maxtext_model, scan, hf_dir, "", np.zeros(0), "",
                        error=f"building the model or its reference failed: {type(e).__name__}: {e}")
            cases.append(case)
            report(case)
          continue
      for scan in (s for s in scans if s in spec.scans):
        case = Case(name, tiny_models.TINY_MODELS[name].maxtext_model, scan, hf_dir, ids_path, reference,
                    os.path.join(model_dir, f"scan_{'on' if scan else 'off'}"), multimodal=bool(spec.inputs),
                    align=align, shipped_floor=spec.shipped_floor)
        cases.append(case)
        futures.append(pool.submit(lambda c: report(run_case(c)) or c, case))
      # Scan-on variants of some rows: a --target_mesh layout, a conversion by two processes.
      variants = []
      if name in FLAGS.target_mesh_families:
        variants.append(("scan_on_target_mesh", dict(converter_flags=(f"--target_mesh={FLAGS.target_mesh}",))))
      if name in FLAGS.multiprocess_families:
        variants.append(("scan_on_2_processes", dict(processes=2)))
      if name in FLAGS.damaged_families:
        variants.append(("scan_on_damaged", dict(damaged=True)))
      if name in FLAGS.relayout_families:
        variants.append(("scan_on_relaid_off", dict(relayout=True)))
      for variant_dir, variant in variants if True in scans and True in spec.scans else ():
        case = Case(name, tiny_models.TINY_MODELS[name].maxtext_model, True, hf_dir, ids_path, reference,
                    os.path.join(model_dir, variant_dir), **variant)
        cases.append(case)
        futures.append(pool.submit(lambda c: report(run_case(c)) or c, case))
      if name in FLAGS.lora_families and True in scans and True in spec.scans and not spec.inputs:
        from tools import lora_adapters  # pylint: disable=g-import-not-at-top

        with _TRANSFORMERS:
          adapter = lora_adapters.make_adapter(hf_dir, os.path.join(model_dir, "lora_adapter"))
          lora_reference = lora_adapters.merged_logits(hf_dir, adapter, np.load(ids_path)).astype(np.float32)
          applied = lora_adapters.merged_logits(hf_dir, adapter, np.load(ids_path), merge=False).astype(np.float32)
        for case in (Case(name, tiny_models.TINY_MODELS[name].maxtext_model, True, hf_dir, ids_path, lora_reference,
                          os.path.join(model_dir, "scan_on_lora"), converter_flags=(f"--lora_adapter_path={adapter}",)),
                     Case(name, tiny_models.TINY_MODELS[name].maxtext_model, True, hf_dir, ids_path, reference,
                          os.path.join(model_dir, "scan_on_lora_export"), lora_export=True),
                     Case(name, tiny_models.TINY_MODELS[name].maxtext_model, True, hf_dir, ids_path, applied,
                          os.path.join(model_dir, "scan_on_lora_restore"), lora_restore=adapter)):
          cases.append(case)
          futures.append(pool.submit(lambda c: report(run_case(c)) or c, case))
      for trainer, trained in (("sft", FLAGS.sft_families), ("tunix_sft", FLAGS.tunix_sft_families)):
        if name in trained and True in scans and True in spec.scans and not spec.inputs:
          case = Case(name, tiny_models.TINY_MODELS[name].maxtext_model, True, hf_dir, ids_path, reference,
                      os.path.join(model_dir, f"scan_on_{trainer}"), **{trainer: True})
          cases.append(case)
          futures.append(pool.submit(lambda c: report(run_case(c)) or c, case))
    concurrent.futures.wait(futures)
  for worker in _all_workers:
    worker.close()

  passed = sum(c.passed for c in cases)
  failed = len(cases) - passed
  if FLAGS.results_page:
    write_results_page(FLAGS.results_page, [c for c in cases if c.multimodal])
  print(f"\nmaxtext interop: {len(cases)} case(s) in {time.monotonic() - start:.0f}s (max|diff| <= {FLAGS.atol:g},"
        " argmax 100%)")
  if FLAGS.work_dir or FLAGS.keep_work_dir or failed:
    print(f"kept {work}")
  else:
    shutil.rmtree(work, ignore_errors=True)
  print(f"{passed} passed, {failed} failed", flush=True)
  return 1 if failed else 0


if __name__ == "__main__":
  app.run(lambda argv: sys.exit(main(argv)))
