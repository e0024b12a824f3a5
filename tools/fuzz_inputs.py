"""Runs the converter on damaged checkpoints, trial after trial, and classifies what it does with each.

  bazel run //tools:fuzz_inputs -- --seed=1 --trials=2000 --results_page=docs/fuzzing-results.md
  bazel run //tools:fuzz_inputs -- --seed=1 --trial=57      # replays trial 57 of seed 1, keeping its files

Tiny models are built once per run (HuggingFace checkpoints: a dense one unsharded and sharded, an MoE sharded, an
FP8 one; and MaxText checkpoints converted from the dense and MoE ones). Each trial copies one of them, damages the
copy (tools/fuzz_damage.py: one change chosen by the trial's seed) and converts it as the binary does: a damaged HF
checkpoint to MaxText, a damaged MaxText checkpoint back to HuggingFace or laid out again. Every trial runs in a
child process forked from this one after the converter's modules are imported (no thread has started by then), so
a trial costs its conversion rather than a process start; --fork=false runs the binary itself instead. A trial
that goes over --memory_limit_mb of resident memory or --trial_timeout_s is killed.

A trial is `converted` (exit 0, an output that reads back: the way back's tensors are the intact checkpoint's
where its stored data was damaged) or `refused` (exit 1, one `error:` line naming a file of the input, no
traceback, nothing that looks finished under the output, nothing left in TMPDIR); anything else is a failure,
printed with the command that replays it. docs/fuzzing.md says what each class means.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import random
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from typing import Callable, Iterable, Iterator, Sequence

# Before numpy loads OpenBLAS, which would start threads in the fork server (converter/main.py sets the same).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# pylint: disable=g-import-not-at-top,g-bad-import-order
from absl import app, flags

from tools import fuzz_damage
# pylint: enable=g-import-not-at-top,g-bad-import-order

OK_CLASSES = ("converted", "refused")
FAILURE_CLASSES = ("traceback", "crash", "memory", "timeout", "unnamed", "left_behind", "silent")
CLASSES = OK_CLASSES + FAILURE_CLASSES
SETUP_FAILED = 3  # A child's exit status when the fuzzer's own damage step raised (a fuzzer bug, reported apart).
CONVERTER_MAIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "converter", "main.py")
ITEMS = os.path.join("0", "items")

# -- models -----------------------------------------------------------------------------------------------------------

DENSE_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 24, "intermediate_size": 128, "num_hidden_layers": 3, "vocab_size": 257,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 512, "hidden_act": "silu",
    "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
MOE_CONFIG = dict(DENSE_CONFIG, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_hidden_layers=2,
                  num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1,
                  mlp_only_layers=[], norm_topk_prob=True, vocab_size=131, torch_dtype="float32")


def model_tensors(config: dict, dtype: str, seed: int = 0) -> dict:
  """Random weights of a Qwen3 (or, with `num_experts`, Qwen3-MoE) checkpoint of `config`, by HF name."""
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(seed)
  np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
  e, h, kv, d = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]

  def weight(*shape: int):
    return (rng.standard_normal(shape) * 0.1).astype(np_dtype)

  def norm(n: int):
    return (1.0 + 0.2 * rng.standard_normal(n)).astype(np_dtype)

  tensors = {"model.embed_tokens.weight": weight(config["vocab_size"], e)}
  for i in range(config["num_hidden_layers"]):
    p = f"model.layers.{i}"
    tensors.update({f"{p}.input_layernorm.weight": norm(e), f"{p}.post_attention_layernorm.weight": norm(e),
                    f"{p}.self_attn.q_proj.weight": weight(h * d, e), f"{p}.self_attn.k_proj.weight": weight(kv * d, e),
                    f"{p}.self_attn.v_proj.weight": weight(kv * d, e), f"{p}.self_attn.o_proj.weight": weight(e, h * d),
                    f"{p}.self_attn.q_norm.weight": norm(d), f"{p}.self_attn.k_norm.weight": norm(d)})
    if "num_experts" in config:
      m = config["moe_intermediate_size"]
      tensors[f"{p}.mlp.gate.weight"] = weight(config["num_experts"], e)
      for x in range(config["num_experts"]):
        tensors.update({f"{p}.mlp.experts.{x}.gate_proj.weight": weight(m, e),
                        f"{p}.mlp.experts.{x}.up_proj.weight": weight(m, e),
                        f"{p}.mlp.experts.{x}.down_proj.weight": weight(e, m)})
    else:
      m = config["intermediate_size"]
      tensors.update({f"{p}.mlp.gate_proj.weight": weight(m, e), f"{p}.mlp.up_proj.weight": weight(m, e),
                      f"{p}.mlp.down_proj.weight": weight(e, m)})
  tensors["model.norm.weight"] = norm(e)
  tensors["lm_head.weight"] = weight(config["vocab_size"], e)
  return tensors


def write_hf_model(directory: str, config: dict, tensors: dict, shards: int = 1) -> str:
  """config.json and the tensors in `shards` files (with an index when more than one)."""
  from tools.safetensors_writer import write_safetensors  # pylint: disable=g-import-not-at-top

  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
  names = list(tensors)
  if shards == 1:
    write_safetensors(os.path.join(directory, "model.safetensors"), tensors, {"format": "pt"})
    return directory
  weight_map = {}
  for shard in range(shards):
    file = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
    part = {name: tensors[name] for name in names[shard::shards]}
    write_safetensors(os.path.join(directory, file), part, {"format": "pt"})
    weight_map.update(dict.fromkeys(part, file))
  index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}
  with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
    json.dump(index, f, indent=2)
  return directory


def build_hf_models(root: str) -> dict[str, str]:
  """The HuggingFace checkpoints trials damage, by name: deterministic, numpy only."""
  from tools import quantize  # pylint: disable=g-import-not-at-top

  models = {
      "dense": write_hf_model(os.path.join(root, "dense"), DENSE_CONFIG, model_tensors(DENSE_CONFIG, "bfloat16")),
      "dense_sharded": write_hf_model(os.path.join(root, "dense_sharded"), dict(DENSE_CONFIG, torch_dtype="float32"),
                                      model_tensors(DENSE_CONFIG, "float32", seed=1), shards=3),
      "moe": write_hf_model(os.path.join(root, "moe"), MOE_CONFIG, model_tensors(MOE_CONFIG, "float32", seed=2),
                            shards=4),
  }
  models["fp8"] = quantize.quantize_fp8(models["dense_sharded"], os.path.join(root, "fp8"), (32, 32))
  return models


@dataclasses.dataclass(frozen=True)
class Converted:
  """A converted checkpoint trials damage: `path` holds OUT (its items at OUT/0/items), `reference` the intact
  checkpoint converted back to HuggingFace, `relayout_digests` its arrays' digests (maxtext_digests) once laid out
  again with each of RELAYOUT_FLAGS."""

  name: str
  source: str
  flags: tuple[str, ...]
  path: str = ""
  reference: str = ""
  relayout_digests: tuple[dict, ...] = ()


MODELS_VERSION = 2  # Of build_models' output: models a work directory holds from another version are rebuilt.
RELAYOUT_FLAGS: tuple[tuple[str, ...], ...] = ((), ("--scan_layers=false",))


CONVERTED = (Converted("dense_scanned", "dense", ()),
             Converted("moe_unscanned", "moe", ("--scan_layers=false", "--compression=none")))


@dataclasses.dataclass(frozen=True)
class Models:
  hf: dict[str, str]
  converted: dict[str, Converted]


# -- trials -----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Trial:
  """What trial `index` of `seed` converts: which model in which direction with which extra flags (the damage is
  chosen when the copy is made, from the same generator)."""

  seed: int
  index: int
  direction: str  # to_maxtext, to_huggingface or relayout.
  model: str
  flags: tuple[str, ...]

  def rng(self) -> random.Random:
    """The trial's generator, past the draws that chose the trial: what damages its copy."""
    rng = random.Random(f"{self.seed}/{self.index}")
    _draw_trial(rng)
    return rng

  @property
  def replay(self) -> str:
    return f"bazel run //tools:fuzz_inputs -- --seed={self.seed} --trial={self.index}"


def _draw_trial(rng: random.Random) -> tuple[str, str, tuple[str, ...]]:
  roll = rng.random()
  if roll < 0.55:
    return "to_maxtext", rng.choice(("dense", "dense_sharded", "moe", "fp8")), rng.choice(
        ((), (), ("--scan_layers=false",), ("--lazy_load_tensors=false",), ("--compression=none",)))
  model = rng.choice([c.name for c in CONVERTED])
  if roll < 0.85:
    return "to_huggingface", model, rng.choice(((), (), ("--max_shard_size=100KB",)))
  return "relayout", model, rng.choice(RELAYOUT_FLAGS)


def plan_trial(seed: int, index: int) -> Trial:
  """Trial `index` of `seed`: a pure function of the two."""
  return Trial(seed, index, *_draw_trial(random.Random(f"{seed}/{index}")))


def prepare_trial(trial: Trial, models: Models, directory: str) -> tuple[list[str], fuzz_damage.Damage]:
  """Copies the trial's model into `directory`/input and damages it; the converter's flags and the damage."""
  source = models.hf[trial.model] if trial.direction == "to_maxtext" else models.converted[trial.model].path
  inputs, output = os.path.join(directory, "input"), os.path.join(directory, "output")
  fuzz_damage.copy_tree(source, inputs)
  rng = trial.rng()
  if trial.direction == "to_maxtext":
    damage = fuzz_damage.damage_huggingface(inputs, rng)
    argv = [f"--hf_model_path={inputs}", f"--output_dir={output}", "--simulated_cpu_devices_count=1"]
  else:
    damage = fuzz_damage.damage_maxtext(inputs, ITEMS, rng)
    items = os.path.join(inputs, damage.file, "items") if damage.kind == "uncommitted" else os.path.join(inputs, ITEMS)
    argv = [f"--checkpoint_path={items}", f"--output_dir={output}"]
    argv += ["--direction=to_huggingface"] if trial.direction == "to_huggingface" else [
        "--simulated_cpu_devices_count=1"]
  return argv + list(trial.flags), damage


# -- running ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Job:
  """One converter run in `directory`: `prepare(directory)` (called in the child) returns its flags."""

  key: object
  directory: str
  prepare: Callable[[str], list[str]]


@dataclasses.dataclass(frozen=True)
class Finished:
  returncode: int | None  # None when a signal ended it.
  signal: int | None
  killed: str | None  # "memory" or "timeout" when the guard killed it.
  peak_rss_bytes: int
  seconds: float


def run_converter_main(argv: list[str]) -> int:
  """`converter/main.py ARGV` in this (forked) process, through absl's app.run as the binary runs: its exit
  status, and on stderr what the binary prints (an uncaught exception's traceback included)."""
  from converter import main as cli  # pylint: disable=g-import-not-at-top

  cli.FLAGS.unparse_flags()
  # app.run refuses to parse flags twice in one process; this child's parent already did, for the fuzzer.
  app._register_and_parse_flags_with_usage.done = False  # pylint: disable=protected-access
  try:
    app.run(cli.main, argv=[CONVERTER_MAIN, *argv])
  except SystemExit as e:
    return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  except BaseException:  # pylint: disable=broad-except  (what Python does with an uncaught exception)
    traceback.print_exc()
    return 1
  return 0


def _threads() -> int:
  return len(os.listdir("/proc/self/task"))


def _rss_bytes(pid: int) -> int:
  try:
    with open(f"/proc/{pid}/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except (OSError, IndexError, ValueError):
    return 0


class Runner:
  """Runs jobs `jobs` at a time, each in a child forked from this process: in its own process group, TMPDIR its
  directory's tmp/, stdout and stderr into its directory's files; `entry(argv)` (the converter's main, in the
  child) or, with `exec_binary`, the converter binary exec'ed in the child. A child over `memory_limit_bytes` of
  resident memory or `timeout_s` is killed with its group."""

  def __init__(self, entry: Callable[[list[str]], int], *, memory_limit_bytes: int, timeout_s: float, jobs: int,
               exec_binary: bool = False, poll_s: float = 0.02):
    self._entry = entry
    self._memory_limit = memory_limit_bytes
    self._timeout = timeout_s
    self._jobs = jobs
    self._exec = exec_binary
    self._poll = poll_s

  def run(self, jobs: Iterable[Job]) -> Iterator[tuple[Job, Finished]]:
    """Each job with how it ended, in the order they finish."""
    pending = collections.deque(jobs)
    running: dict[int, tuple[Job, float, list]] = {}
    while pending or running:
      while pending and len(running) < self._jobs:
        job = pending.popleft()
        running[self._start(job)] = (job, time.monotonic(), [None, 0])
      for pid in list(running):
        job, start, state = running[pid]
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
          del running[pid]
          state[1] = max(state[1], usage.ru_maxrss * 1024)
          yield job, Finished(os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                              os.WTERMSIG(status) if os.WIFSIGNALED(status) else None, state[0], state[1],
                              time.monotonic() - start)
          continue
        rss = _rss_bytes(pid)
        state[1] = max(state[1], rss)
        if state[0] is None and (rss > self._memory_limit or time.monotonic() - start > self._timeout):
          state[0] = "memory" if rss > self._memory_limit else "timeout"
          try:
            os.killpg(pid, signal.SIGKILL)
          except ProcessLookupError:
            pass
      time.sleep(self._poll)

  def _start(self, job: Job) -> int:
    if self._entry is not None and not self._exec and _threads() != 1:
      raise RuntimeError(f"{_threads()} threads in the fork server: a forked child would inherit their locks")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
      try:
        os.setpgid(pid, pid)
      except OSError:
        pass  # The child set it already, or is gone.
      return pid
    code = SETUP_FAILED
    try:
      os.setpgid(0, 0)
      tmp = os.path.join(job.directory, "tmp")
      os.makedirs(tmp, exist_ok=True)
      os.environ["TMPDIR"] = tmp
      tempfile.tempdir = None
      try:
        argv = job.prepare(job.directory)
      except BaseException:  # pylint: disable=broad-except  (reported as the fuzzer's own failure)
        with open(os.path.join(job.directory, "setup_error"), "w") as f:
          traceback.print_exc(file=f)
        os._exit(SETUP_FAILED)  # pylint: disable=protected-access
      for fd, name in ((1, "stdout"), (2, "stderr")):
        target = os.open(os.path.join(job.directory, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
      if self._exec:
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(CONVERTER_MAIN)))
        os.execve(sys.executable, [sys.executable, CONVERTER_MAIN, *argv], env)
      code = self._entry(argv)
    except BaseException:  # pylint: disable=broad-except
      traceback.print_exc()
      code = 1
    finally:
      try:
        sys.stdout.flush()
        sys.stderr.flush()
      finally:
        os._exit(code)  # pylint: disable=protected-access


# -- classification ---------------------------------------------------------------------------------------------------


def safetensors_contents(directory: str) -> dict[str, tuple[str, tuple[int, ...], str]]:
  """Every tensor of the safetensors files in `directory`: dtype, shape and a digest of its bytes."""
  found = {}
  for name in sorted(os.listdir(directory)):
    if not name.endswith(".safetensors"):
      continue
    with open(os.path.join(directory, name), "rb") as f:
      data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8: 8 + length])
    for tensor, entry in header.items():
      if tensor != "__metadata__":
        begin, end = entry["data_offsets"]
        found[tensor] = (entry["dtype"], tuple(entry["shape"]),
                         hashlib.sha256(data[8 + length + begin: 8 + length + end]).hexdigest())
  return found


def looks_finished(output: str, direction: str) -> bool:
  """What a reader would take for a finished checkpoint: OUT/0 or a commit marker (MaxText), config.json beside
  safetensors (HuggingFace)."""
  if not os.path.isdir(output):
    return False
  if direction == "to_huggingface":
    names = os.listdir(output)
    return "config.json" in names and any(n.endswith(".safetensors") for n in names)
  markers = [d for d, _, fs in os.walk(output) if "commit_success.txt" in fs]
  return bool(markers) or os.path.exists(os.path.join(output, "0"))


def maxtext_output_problem(output: str) -> str | None:
  """Why a MaxText output a converter said it wrote does not read as a checkpoint, or None."""
  items = os.path.join(output, ITEMS)
  for name in ("_METADATA", "manifest.ocdbt", "commit_success.txt"):
    if not os.path.isfile(os.path.join(items, name)):
      return f"{items}/{name} missing"
  try:
    with open(os.path.join(items, "_METADATA")) as f:
      json.load(f)
  except ValueError as e:
    return f"{items}/_METADATA is not JSON: {e}"
  return None


@dataclasses.dataclass(frozen=True)
class Observed:
  """What a trial's run did, as the classification needs it."""

  finished: Finished
  stderr: str
  input_root: str
  finished_output: bool
  left_files: tuple[str, ...] = ()  # In TMPDIR, or staging beside the output.
  output_problem: str | None = None  # A successful run's output that does not read back.
  values_differ: str | None = None  # A tensor the way back wrote that differs from the intact checkpoint's.
  must_refuse: str | None = None  # The damage every successful conversion ignores wrongly.


def classify(observed: Observed) -> tuple[str, str]:
  """(class, reason) of one trial."""
  finished = observed.finished
  if finished.killed:
    return finished.killed, f"killed at {finished.peak_rss_bytes / 2**20:.0f} MiB after {finished.seconds:.1f} s"
  if finished.signal is not None:
    return "crash", f"signal {signal.Signals(finished.signal).name}"
  if "Traceback (most recent call last)" in observed.stderr:
    lines = [line for line in observed.stderr.splitlines() if line and not line.startswith(" ")]
    return "traceback", lines[-1][:300] if lines else "Traceback"
  if observed.left_files:
    return "left_behind", f"left {', '.join(observed.left_files[:3])}"
  if finished.returncode == 0:
    if observed.must_refuse:
      return "silent", f"converted although {observed.must_refuse}"
    if observed.values_differ:
      return "silent", observed.values_differ
    if observed.output_problem:
      return "silent", f"exit 0 but {observed.output_problem}"
    return "converted", ""
  errors = [line for line in observed.stderr.splitlines() if line.startswith("error: ")]
  if observed.finished_output:
    return "left_behind", f"exit {finished.returncode} and an output that looks finished"
  if finished.returncode != 1 or len(errors) != 1:
    tail = observed.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
    return "unnamed", f"exit {finished.returncode}, {len(errors)} error lines: {tail[0][:300]}"
  if observed.input_root not in errors[0]:
    return "unnamed", errors[0][:300]
  return "refused", errors[0][:300]


def _left_files(directory: str) -> tuple[str, ...]:
  """Files in the trial's TMPDIR, and anything beside the input and output (an output's staging left behind)."""
  left = [os.path.join("tmp", os.path.relpath(os.path.join(d, f), os.path.join(directory, "tmp")))
          for d, _, fs in os.walk(os.path.join(directory, "tmp")) for f in fs]
  left += [name for name in os.listdir(directory) if name not in _TRIAL_FILES]
  return tuple(sorted(left))


_TRIAL_FILES = frozenset({"input", "output", "tmp", "stdout", "stderr", "damage.json", "setup_error"})


def observe(directory: str, finished: Finished, direction: str, reference: str | dict | None = None) -> Observed:
  """What the run in `directory` left there (its input, output, stderr, damage.json and tmp/); where it converted
  a checkpoint with damaged stored values, its values against the intact checkpoint's: `reference`, the HF
  directory the way back wrote from it, or the digests of its relayout (maxtext_digests)."""
  with open(os.path.join(directory, "stderr"), errors="replace") as f:
    stderr = f.read()
  with open(os.path.join(directory, "damage.json")) as f:
    damage = fuzz_damage.Damage(**json.load(f))
  output = os.path.join(directory, "output")
  output_problem = values_differ = None
  if finished.returncode == 0 and not finished.killed:
    if direction == "to_maxtext":
      output_problem = maxtext_output_problem(output)
      if not output_problem and damage.stored_values and isinstance(reference, dict):
        values_differ = _compare_digests(in_child(maxtext_digests, os.path.join(output, ITEMS)), reference)
    elif damage.stored_values and reference:
      values_differ = _compare(output, reference)
  return Observed(finished, stderr, os.path.join(directory, "input"), looks_finished(output, direction),
                  _left_files(directory), output_problem, values_differ,
                  str(damage) if damage.must_refuse else None)


def maxtext_digests(items: str) -> dict[str, list]:
  """Every array of the MaxText checkpoint at `items`: dtype, shape and a digest of its values. Through TensorStore,
  which starts threads: call it through `in_child`."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top

  base = f"file://{items}"
  store = ts.KvStore.open({"driver": "ocdbt", "base": base}).result()
  leaves = sorted(k.decode()[: -len("/zarr.json")] for k in store.list().result() if k.endswith(b"/zarr.json"))
  found = {}
  for leaf in leaves:
    array = ts.open({"driver": "zarr3", "kvstore": {"driver": "ocdbt", "base": base, "path": f"{leaf}/"}}).result()
    values = array.read().result()
    found[leaf] = [str(values.dtype), list(values.shape), hashlib.sha256(values.tobytes()).hexdigest()]
  return found


def in_child(function: Callable, *args) -> object:
  """`function(*args)` (JSON in, JSON out) run in a forked child, so that the threads it starts stay out of the
  fork server; an exception it raises comes back as {"error": ...}."""
  read_fd, write_fd = os.pipe()
  pid = os.fork()
  if not pid:
    os.close(read_fd)
    try:
      answer = {"value": function(*args)}
    except BaseException as e:  # pylint: disable=broad-except
      answer = {"error": f"{type(e).__name__}: {e}"}
    with os.fdopen(write_fd, "w") as f:
      json.dump(answer, f)
    os._exit(0)  # pylint: disable=protected-access
  os.close(write_fd)
  with os.fdopen(read_fd) as f:
    text = f.read()
  os.waitpid(pid, 0)
  return json.loads(text) if text else {"error": "the child died"}


def _compare_digests(got: dict, expected: dict) -> str | None:
  if "error" in got:
    return f"the output's arrays do not read: {got['error']}"
  got = got["value"]
  for leaf in sorted(set(got) | set(expected)):
    if got.get(leaf) != expected.get(leaf):
      return f"{leaf} differs from the intact checkpoint's relayout"
  return None


def _compare(output: str, reference: str) -> str | None:
  try:
    got = safetensors_contents(output)
  except (OSError, ValueError, KeyError, struct.error) as e:
    return f"the output's safetensors do not read: {e}"
  expected = safetensors_contents(reference)
  for name in sorted(set(got) | set(expected)):
    if got.get(name) != expected.get(name):
      return f"{name} differs from the intact checkpoint's"
  return None


# -- a run ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Outcome:
  trial: Trial
  cls: str
  reason: str
  damage: str
  seconds: float
  peak_rss_bytes: int


def _trial_job(trial: Trial, models: Models, directory: str) -> Job:
  def prepare(path: str) -> list[str]:
    argv, damage = prepare_trial(trial, models, path)
    with open(os.path.join(path, "damage.json"), "w") as f:
      json.dump(dataclasses.asdict(damage), f)
    return argv

  return Job(trial, directory, prepare)


def build_models(root: str, runner: Runner) -> Models:
  """The HF models, each MaxText checkpoint converted from one, and that checkpoint converted back (the reference
  the way back's tensors are compared with): the conversions through `runner`, as trials run. Models `root`
  holds from an earlier run are reused (a replay with the same --work_dir then damages the very same files: the
  OCDBT data files a conversion writes are not the same from one conversion to the next)."""
  built = os.path.join(root, "models.json")
  saved = {}
  if os.path.exists(built):
    with open(built) as f:
      saved = json.load(f)
  if saved.get("version") == MODELS_VERSION:
    return Models(saved["hf"], {name: Converted(**c) for name, c in saved["converted"].items()})
  shutil.rmtree(root, ignore_errors=True)
  hf = build_hf_models(os.path.join(root, "hf"))
  converted = {c.name: dataclasses.replace(c, path=os.path.join(root, c.name),
                                           reference=os.path.join(root, f"{c.name}_back")) for c in CONVERTED}
  forward = [Job(c, os.path.join(root, f"{c.name}_run"),
                 lambda _, c=c: [f"--hf_model_path={hf[c.source]}", f"--output_dir={c.path}",
                                 "--simulated_cpu_devices_count=1", *c.flags]) for c in converted.values()]
  back = [Job(c, os.path.join(root, f"{c.name}_back_run"),
              lambda _, c=c: ["--direction=to_huggingface", f"--checkpoint_path={os.path.join(c.path, ITEMS)}",
                              f"--output_dir={c.reference}"]) for c in converted.values()]
  relayouts = [Job((c, i), os.path.join(root, f"{c.name}_relayout{i}_run"),
                   lambda path, c=c, flags=flags: [f"--checkpoint_path={os.path.join(c.path, ITEMS)}",
                                                   f"--output_dir={os.path.join(path, 'output')}",
                                                   "--simulated_cpu_devices_count=1", *flags])
               for c in converted.values() for i, flags in enumerate(RELAYOUT_FLAGS)]
  digests = collections.defaultdict(dict)
  for jobs in (forward, back + relayouts):
    for job in jobs:
      os.makedirs(job.directory)
    for job, finished in runner.run(jobs):
      if finished.returncode != 0:
        with open(os.path.join(job.directory, "stderr")) as f:
          raise RuntimeError(f"building {job.directory} failed ({finished}):\n{f.read()[-3000:]}")
      if job in relayouts:
        (c, i) = job.key
        digests[c.name][i] = in_child(maxtext_digests, os.path.join(job.directory, "output", ITEMS))["value"]
      shutil.rmtree(job.directory)
  converted = {name: dataclasses.replace(c, relayout_digests=tuple(digests[name][i] for i in range(len(RELAYOUT_FLAGS))))
               for name, c in converted.items()}
  with open(built, "w") as f:
    json.dump({"version": MODELS_VERSION, "hf": hf, "converted": {name: dataclasses.asdict(c) for name, c in converted.items()}}, f)
  return Models(hf, converted)


def run_trials(trials: Sequence[Trial], models: Models, runner: Runner, work_dir: str, *, keep: bool = False,
               on_outcome: Callable[[Outcome], None] = lambda _: None) -> list[Outcome]:
  """Every trial run and classified (a trial whose damage step failed is a `setup` outcome: the fuzzer's bug)."""
  jobs = []
  for trial in trials:
    directory = os.path.join(work_dir, f"trial-{trial.seed}-{trial.index}")
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    jobs.append(_trial_job(trial, models, directory))
  outcomes = []
  for job, finished in runner.run(jobs):
    trial = job.key
    if finished.returncode == SETUP_FAILED and os.path.exists(os.path.join(job.directory, "setup_error")):
      with open(os.path.join(job.directory, "setup_error")) as f:
        outcome = Outcome(trial, "setup", f.read().strip().splitlines()[-1], "", finished.seconds, 0)
    else:
      back = trial.direction == "to_huggingface"
      reference = None
      if back:
        reference = models.converted[trial.model].reference
      elif trial.direction == "relayout":
        reference = models.converted[trial.model].relayout_digests[RELAYOUT_FLAGS.index(trial.flags)]
      cls, reason = classify(observe(job.directory, finished, "to_huggingface" if back else "to_maxtext", reference))
      with open(os.path.join(job.directory, "damage.json")) as f:
        damage = str(fuzz_damage.Damage(**json.load(f)))
      outcome = Outcome(trial, cls, reason, damage, finished.seconds, finished.peak_rss_bytes)
    outcomes.append(outcome)
    on_outcome(outcome)
    if not keep:
      shutil.rmtree(job.directory, ignore_errors=True)
  return sorted(outcomes, key=lambda o: o.trial.index)


def summary(outcomes: Sequence[Outcome], seconds: float) -> str:
  """The table of classes and counts, the failure rate and the wall time."""
  counts = collections.Counter(o.cls for o in outcomes)
  failures = sum(counts[c] for c in FAILURE_CLASSES) + counts["setup"]
  lines = ["| class | trials |", "|---|---:|"]
  lines += [f"| {cls} | {counts[cls]} |" for cls in CLASSES + ("setup",) if counts[cls] or cls in OK_CLASSES + FAILURE_CLASSES]
  lines.append("")
  lines.append(f"{len(outcomes)} trials, {failures} failures ({failures / max(1, len(outcomes)):.1%}),"
               f" {seconds:.0f} s wall ({seconds / max(1, len(outcomes)):.2f} s a trial)")
  return "\n".join(lines)


def failure_lines(outcomes: Sequence[Outcome]) -> list[str]:
  return [f"- trial {o.trial.index} ({o.trial.direction}, {o.trial.model}{', ' if o.trial.flags else ''}"
          f"{' '.join(o.trial.flags)}): **{o.cls}**: {o.reason}\n  damage: {o.damage}\n  replay: `{o.trial.replay}`"
          for o in outcomes if o.cls not in OK_CLASSES]


def results_page(seed: int, outcomes: Sequence[Outcome], seconds: float, jobs: int, fork: bool) -> str:
  directions = collections.Counter(o.trial.direction for o in outcomes)
  return "\n".join([
      "# Fuzzing results",
      "",
      "Written by `tools/fuzz_inputs.py --results_page` (docs/fuzzing.md says what is damaged and how a trial is"
      " classified).",
      "",
      f"Seed {seed}, {len(outcomes)} trials ({', '.join(f'{n} {d}' for d, n in sorted(directions.items()))}),"
      f" {jobs} at a time, {'forked from a fork server' if fork else 'each a process of the binary'}.",
      "",
      summary(outcomes, seconds),
      "",
      "## Failures",
      "",
      *(failure_lines(outcomes) or ["None."]),
      "",
  ])


_SEED = flags.DEFINE_integer("seed", 0, "Which damage each trial does: trial i's is a function of (seed, i).")
_TRIALS = flags.DEFINE_integer("trials", 200, "Trials 0 .. N-1 of --seed.", lower_bound=1)
_TRIAL = flags.DEFINE_integer("trial", None, "Only this trial of --seed (a replay): its files are kept and its"
                              " stderr printed.", lower_bound=0)
_JOBS = flags.DEFINE_integer("jobs", 2, "Trials run at once.", lower_bound=1)
_FORK = flags.DEFINE_boolean("fork", True, "Fork each trial from this process, the converter already imported;"
                             " false: exec the converter binary in each trial's child (a process start each).")
_MEMORY_LIMIT_MB = flags.DEFINE_integer("memory_limit_mb", 1024, "A trial's resident memory above this is killed"
                                        " (class memory).", lower_bound=64)
_TRIAL_TIMEOUT_S = flags.DEFINE_float("trial_timeout_s", 120.0, "A trial running longer is killed (class timeout).")
_WORK_DIR = flags.DEFINE_string("work_dir", None, "Where models and trials are written (default: a temporary"
                                " directory, removed at the end unless --keep).")
_KEEP = flags.DEFINE_boolean("keep", False, "Keep every trial's files (a replay keeps its one trial's).")
_RESULTS_PAGE = flags.DEFINE_string("results_page", None, "Write the results as markdown to this path.")


def import_converter() -> Callable[[list[str]], int]:
  """Imports what every conversion loads (JAX, Orbax, TensorStore, both directions) without starting a thread, so
  that forked trials start with it; returns the entry a trial calls."""
  # pylint: disable=g-import-not-at-top,unused-import
  from converter import main  # First: it keeps numpy's OpenBLAS from starting its threads.
  import jax
  import orbax.checkpoint
  import tensorstore
  from converter import conversion
  from converter.planning import relayout
  from converter.reverse import to_huggingface
  import handlers
  # pylint: enable=g-import-not-at-top,unused-import
  return run_converter_main


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  entry = import_converter() if _FORK.value else None
  runner = Runner(entry, memory_limit_bytes=_MEMORY_LIMIT_MB.value << 20, timeout_s=_TRIAL_TIMEOUT_S.value,
                  jobs=_JOBS.value, exec_binary=not _FORK.value)
  cwd = os.environ.get("BUILD_WORKING_DIRECTORY", os.getcwd())
  work_dir = os.path.join(cwd, _WORK_DIR.value) if _WORK_DIR.value else tempfile.mkdtemp(prefix="fuzz-inputs-")
  replay = _TRIAL.value is not None
  start = time.monotonic()
  try:
    models = build_models(os.path.join(work_dir, "models"), runner)
    print(f"models built in {time.monotonic() - start:.1f} s", flush=True)
    indices = [_TRIAL.value] if replay else range(_TRIALS.value)
    trials = [plan_trial(_SEED.value, i) for i in indices]

    def report(outcome: Outcome) -> None:
      if outcome.cls not in OK_CLASSES or replay:
        print(f"trial {outcome.trial.index}: {outcome.cls}: {outcome.reason}\n  damage: {outcome.damage}\n"
              f"  replay: {outcome.trial.replay}", flush=True)

    start = time.monotonic()
    log = open(os.path.join(work_dir, "outcomes.jsonl"), "w")  # pylint: disable=consider-using-with

    def record(outcome: Outcome) -> None:
      report(outcome)
      log.write(json.dumps(dataclasses.asdict(outcome)) + "\n")
      log.flush()

    with log:
      outcomes = run_trials(trials, models, runner, os.path.join(work_dir, "trials"), keep=_KEEP.value or replay,
                            on_outcome=record)
    seconds = time.monotonic() - start
    if replay:
      directory = os.path.join(work_dir, "trials", f"trial-{_SEED.value}-{_TRIAL.value}")
      with open(os.path.join(directory, "stderr"), errors="replace") as f:
        print(f"its files: {directory}\nits stderr:\n{f.read()[-6000:]}")
      return
    print(summary(outcomes, seconds))
    if _RESULTS_PAGE.value:
      page = os.path.join(cwd, _RESULTS_PAGE.value)
      with open(page, "w") as f:
        f.write(results_page(_SEED.value, outcomes, seconds, _JOBS.value, _FORK.value))
      print(f"wrote {page}")
  finally:
    if not (_KEEP.value or replay or _WORK_DIR.value):
      shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
  app.run(main)
