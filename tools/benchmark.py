"""Benchmarks the converter on a synthetic checkpoint: wall time and peak memory against the I/O floor.

  bazel run //tools:benchmark -- --family=qwen3_moe --size_gb=8 --devices=1,16 --runs=3
  bazel run //tools:benchmark -- --family=deepseek3_fp8 --size_gb=6 --devices=1 --runs=3
  bazel run //tools:benchmark -- --family=qwen3_5_fp8 --size_gb=4 --devices=1 --runs=3
  bazel run //tools:benchmark -- --family=deepseek4_fp4 --full_size_dry_run --devices=1 --runs=3
  bazel run //tools:benchmark -- --family=kimi_k26_int4 --full_size_dry_run --devices=1 --runs=1
  bazel run //tools:benchmark -- --family=kimi_k26_int4 --size_gb=22 --devices=1 --runs=1 --noreverse --nomaxtext_route

Writes a synthetic HF checkpoint of the family and size (numpy, random gaussian values; FP8 with block scales for
deepseek3_fp8), then for each device count runs the real converter binary in a child process `--runs` times,
sampling the RSS of the whole process tree, beside the peak `--dry_run` predicted for the same command (what a
user sizes a host from). The floor, measured in the same run, is reading every input byte and
writing as many bytes as the conversion writes (the checkpoint's bytes; twice the input's for FP8, which becomes
bfloat16), with fsync: no converter can beat it on this disk. Prints medians and the ratios to the floor.

For a quantized input it also times, in the same run, the route MaxText offers: a separate pass that writes a
dequantized bfloat16 copy (tools/dequantize_checkpoint.py), then the conversion of that copy, which is also the
bfloat16 baseline for peak memory. Where MaxText has a native fp8 model of the family (qwen3_5_fp8), it also
times `--keep_fp8`, against its own floor: the output is then about as large as the input.

`--full_size_dry_run` instead writes the family's real model at full size (DeepSeek-V4-Flash, 160 GB) as a sparse
checkpoint (headers, and holes where the data goes) and times `--dry_run` on it: the plan and every check a
conversion makes before it reads a weight, from the headers alone.

`--relayout` also lays each output out again (MaxText -> MaxText, `--checkpoint_path`, the scan flipped,
bfloat16), against the I/O floor of reading that checkpoint and writing as many bytes as the relayout writes, and
the codec floor of decoding the source's chunks plus encoding the output's (the decompression floor plus the
compression floor at the level the relayout writes with).

Each completed run also adds a section to a Markdown results page (`--results_page`, by default
docs/benchmark-results.md in the repository), headed by its date, the machine and the exact command, with the
tables it printed: measured figures are recorded by the tool that measured them, never pasted by hand.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import psutil
from absl import app, flags

from converter.layout import chunking
from converter.planning.plan import default_zstd_level
from converter.sources import quant_method
from tools import floors, synthetic_checkpoint
from tools.ports import free_port
from tools.benchmark_runner import (PYTHON, REPO, ResultsPage, ResultTable, child_env, children_cpu_seconds,
                                    command_line, dry_run, dry_run_lines, du, files, machine_description,
                                    markdown_table, measure, print_table, render_run_section)
from tools.process_sampling import tree_rss

FLAGS = flags.FLAGS
flags.DEFINE_enum("family", "qwen3_moe", sorted(synthetic_checkpoint.FAMILIES), "Synthetic model family.")
flags.DEFINE_float("size_gb", 8.0, "Approximate checkpoint size in GB (10^9 bytes), bfloat16.")
flags.DEFINE_list("devices", ["1", "16"], "--simulated_cpu_devices_count values to run.")
flags.DEFINE_boolean("scan_layers", True, "--scan_layers for the conversions.")
flags.DEFINE_integer("runs", 3, "Runs per setting; medians are reported.")
flags.DEFINE_string("work_dir", "/tmp/hf2maxtext-benchmark", "Where the synthetic checkpoint and outputs go.")
flags.DEFINE_boolean("keep_input", True, "Reuse a synthetic checkpoint of the same family and size if present.")
flags.DEFINE_integer("max_inflight_bytes", None, "Passed to the converter when set.")
flags.DEFINE_float("memory_limit_gib", None, "Run each conversion in a memory cgroup of this size (page cache"
                   " included): a model larger than the memory it may use, on a machine whose disk cannot hold one"
                   " larger than its RAM. Needs root and a cgroup v1 or v2 memory controller.")

flags.DEFINE_boolean("full_size_dry_run", False, "Instead of converting a --size_gb checkpoint: the family's real"
                     " model at full size (synthetic_checkpoint.FULL_SIZE), written sparse, through --dry_run alone.")
flags.DEFINE_boolean("maxtext_route", True, "For a quantized input, also time MaxText's route (a dequantized"
                     " bfloat16 copy, then its conversion) and the codec floor on that copy. --nomaxtext_route where"
                     " the disk cannot hold the copy beside the input (Kimi's INT4 experts: a copy 4x their size);"
                     " the codec floor and the CPU-s ratios are then not measured.")
flags.DEFINE_boolean("reverse", True, "Also convert each output back to HuggingFace, against its own floors:"
                     " reading the checkpoint + writing the safetensors, and zstd decompression.")
flags.DEFINE_boolean("hub", False, "With --reverse: also push each way back to a Hub repo (hf://, through the Hub"
                     " stand-in on 127.0.0.1 speaking huggingface_hub's LFS upload protocol, a fresh repo each run):"
                     " its wall and peak RSS beside the local way back's.")
flags.DEFINE_boolean("relayout", False, "Also lay each output out again as MaxText (--checkpoint_path, scan flipped,"
                     " bfloat16: docs/relayout.md), against its own floors: reading the checkpoint + writing the new one,"
                     " and decompression + compression (the source's chunks decoded, the output's encoded).")
flags.DEFINE_integer("shard_mb", 4096, "Largest safetensors shard of the synthetic checkpoint, in MiB (one tensor"
                     " larger than it gets a shard of its own).")
flags.DEFINE_integer("lora_rank", 0, "Also convert with a random LoRA adapter of this rank merged (every attention"
                     " and MLP projection but routed experts): what the merge costs.")
flags.DEFINE_list("processes", [], "Also convert with several processes (one device each, joined on 127.0.0.1):"
                  " these counts unpinned, plus 1 process pinned to core 0 against 2 pinned to cores 0 and 1.")
flags.DEFINE_string("bucket", None, "Also convert from and to a bucket: `emulator` (fake-gcs-server on 127.0.0.1,"
                    " objects on the work_dir's disk; it handles multi-GB uploads slowly: use --shard_mb=40) or gs://BUCKET/PREFIX (a real one, or the one"
                    " STORAGE_EMULATOR_HOST points at); the input is uploaded there once.")
flags.DEFINE_list("variant_flags", [], "Also convert with these converter flags added, right after each run of the"
                  " default (an A/B in the same runs, on the same machine state), as a row of its own: e.g."
                  " --nochunk_checksums for what the chunks' checksums cost.")
flags.DEFINE_string("results_page", "docs/benchmark-results.md", "Markdown page the run's tables are added to, newest"
                    " run first (created when absent); a relative path is taken from the repository root. Empty:"
                    " write no page.")

RESULTS_PAGE = ResultsPage(
    "# Benchmark results",
    "Written by `tools/benchmark.py` at the end of every run; what the columns mean and how to run it:"
    " [benchmarks.md](benchmarks.md). Compare ratios within one run, not walls across runs or machines.",
    "<!-- tools/benchmark.py adds each run below this line, newest first. -->")


class MemoryCgroup:
  """A memory cgroup (v1 or v2) that commands can be started in; removed on exit."""

  def __init__(self, limit_bytes: int):
    v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers") and not os.path.isdir("/sys/fs/cgroup/memory")
    root = "/sys/fs/cgroup" if v2 else "/sys/fs/cgroup/memory"
    self.path = os.path.join(root, f"hf2maxtext-benchmark-{os.getpid()}")
    os.makedirs(self.path, exist_ok=True)
    limit_file = "memory.max" if v2 else "memory.limit_in_bytes"
    with open(os.path.join(self.path, limit_file), "w") as f:
      f.write(str(limit_bytes))

  def wrap(self, command: list[str]) -> list[str]:
    """`command`, moved into the cgroup before it starts (its whole process tree stays there)."""
    return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "sh", *command]

  def remove(self) -> None:
    try:
      os.rmdir(self.path)
    except OSError:
      pass


# The converter's main.py with `LazyTensor.read` timed: prints, at exit, the wall-clock time its first block read
# started (early reads included), for `start_up_cost`. Only the probe is added before main.py runs.
_FIRST_READ_PROBE = """
import atexit, os, runpy, sys, time
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
from handlers import lazy_tensor
read, first = lazy_tensor.LazyTensor.read, []
def probe(self, index):
  first or first.append(time.time())
  return read(self, index)
lazy_tensor.LazyTensor.read = probe
atexit.register(lambda: print("first block read at", *first, file=sys.stderr))
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@dataclasses.dataclass(frozen=True)
class StartUp:
  """Medians of what a run costs before its first byte, per direction: the floors, timed inside a running
  process, do not pay it."""

  wall: float  # To MaxText: interpreter, imports, JAX's runtime and Orbax.
  cpu: float
  first_read: float  # Seconds from starting the process to its first block read.
  reverse_wall: float  # Back to HuggingFace (one process: neither JAX nor Orbax).
  reverse_cpu: float


def start_up_cost(runs: int) -> StartUp:
  """The start-up of converting the bundled tiny checkpoint (0.4 MB) and of converting it back."""
  walls, cpus, first_reads, reverse_walls, reverse_cpus = [], [], [], [], []
  scratch = os.path.join(FLAGS.work_dir, "tiny-out")
  back = os.path.join(FLAGS.work_dir, "tiny-back")

  def run(command: list[str]) -> tuple[str, float, float, float]:
    """The run's stderr, the time.time() it started at, its wall and its CPU-seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started, start = time.time(), time.monotonic()
    result = subprocess.run(command, env=child_env(), check=True, capture_output=True,
                            text=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return result.stderr, started, wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime

  for attempt in range(2 * runs):  # Alternately plain (wall and CPU, and back) and probed (the first read).
    probed = attempt % 2 == 1
    command = [PYTHON, *(["-c", _FIRST_READ_PROBE] if probed else []), os.path.join(REPO, "converter", "main.py"),
               f"--hf_model_path={os.path.join(REPO, 'testdata', 'tiny-qwen3')}", f"--output_dir={scratch}",
               "--overwrite", "--simulated_cpu_devices_count=1", "--noprogress"]
    stderr, started, wall, cpu = run(command)
    if probed:
      first_reads.append(float(stderr.split("first block read at")[-1].split()[0]) - started)
      continue
    walls.append(wall)
    cpus.append(cpu)
    shutil.rmtree(back, ignore_errors=True)
    _, _, wall, cpu = run(_reverse_command(os.path.join(scratch, "0", "items"), back))
    reverse_walls.append(wall)
    reverse_cpus.append(cpu)
  shutil.rmtree(scratch, ignore_errors=True)
  shutil.rmtree(back, ignore_errors=True)
  median = statistics.median
  return StartUp(median(walls), median(cpus), median(first_reads), median(reverse_walls), median(reverse_cpus))


def _convert_command(input_dir: str, output_dir: str, devices: str, *flags_: str) -> list[str]:
  command = [PYTHON, os.path.join(REPO, "converter", "main.py"), f"--hf_model_path={input_dir}",
             f"--output_dir={output_dir}", "--overwrite", f"--simulated_cpu_devices_count={devices}",
             f"--scan_layers={FLAGS.scan_layers}", "--noprogress", *flags_]
  if FLAGS.max_inflight_bytes:
    command.append(f"--max_inflight_bytes={FLAGS.max_inflight_bytes}")
  return command


def _run(label: str, command: list[str], env: dict[str, str], cgroup: MemoryCgroup | None,
         outputs: list[str] | None = None) -> tuple[float, int, float]:
  """Wall seconds, peak RSS and CPU seconds (user + system, every thread) of `command`; its stdout is appended to
  `outputs` when given."""
  measured = measure(label, cgroup.wrap(command) if cgroup else command, env)
  if outputs is not None:
    outputs.append(measured.stdout)
  print(f"{label} wall={measured.wall:.1f}s cpu={measured.cpu:.1f}s peak_rss={measured.peak / 2**30:.2f}GiB",
        flush=True)
  return measured.wall, measured.peak, measured.cpu


def _has_native_fp8(input_dir: str) -> bool:
  from converter import families  # pylint: disable=g-import-not-at-top
  from converter.model_config import load_model_config  # pylint: disable=g-import-not-at-top

  return families.resolve(load_model_config(input_dir)).family.fp8_unquantized_modules is not None


def run_processes(input_dir: str, output_dir: str, count: int, cores: list[int] | None,
                  env: dict[str, str]) -> tuple[float, list[int], float]:
  """One conversion by `count` processes (each pinned to `cores[i]` when given); returns the wall until the last
  one exits, each process's peak RSS and the CPU seconds (user + system) of all of them together."""
  address = f"127.0.0.1:{free_port()}"
  children, peaks = [], [0] * count
  os.sync()  # As before every conversion (run_sampled).
  cpu_before = children_cpu_seconds()
  start = time.monotonic()
  for i in range(count):
    command = _convert_command(input_dir, output_dir, "1")
    if count > 1:
      command += [f"--num_processes={count}", f"--process_id={i}", f"--coordinator_address={address}"]
    if cores is not None:
      command = ["taskset", "-c", str(cores[i]), *command]
    children.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  done = threading.Event()

  def sample():
    processes = [psutil.Process(c.pid) for c in children]
    while not done.is_set():
      for i, process in enumerate(processes):
        try:
          peaks[i] = max(peaks[i], tree_rss(process))
        except psutil.Error:
          pass
      time.sleep(0.02)

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  results = [c.communicate() for c in children]
  wall = time.monotonic() - start
  cpu = children_cpu_seconds() - cpu_before
  done.set()
  sampler.join()
  for child, (_, stderr) in zip(children, results):
    if child.returncode:
      sys.exit(f"{count} processes: a process failed ({child.returncode}):\n{stderr[-3000:]}")
  return wall, peaks, cpu


def run_codec_processes(input_dir: str, nbytes: int, count: int, cores: list[int]) -> tuple[float, list[int], float]:
  """The compression floor's work (encoding only) split over `count` processes, each pinned to `cores[i]` and
  encoding every `count`-th piece: how far this machine itself scales the codec's work, the control for
  `run_processes`. Returns the wall until the last one exits, no peaks, and the CPU seconds of all of them."""
  os.sync()
  cpu_before = children_cpu_seconds()
  start = time.monotonic()
  share = lambda i: floors.child_command(floors.compression_floors, input_dir, nbytes, FLAGS.work_dir, i, count,
                                         False)
  children = [subprocess.Popen(["taskset", "-c", str(cores[i]), *share(i)], env=child_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(count)]
  results = [c.communicate() for c in children]
  wall = time.monotonic() - start
  cpu = children_cpu_seconds() - cpu_before
  for child, (_, stderr) in zip(children, results):
    if child.returncode:
      sys.exit(f"the codec's work in {count} processes failed:\n{stderr[-3000:]}")
  return wall, [], cpu


def _scaling_runs(input_dir: str, input_bytes: int, env: dict[str, str]) -> ResultTable:
  """The settings are run in turn, round after round (not each `--runs` times in a row): this machine's speed
  drifts by tens of percent over minutes, and a ratio of medians taken minutes apart measured the drift as much
  as the scaling (1.40x, 1.59x, 1.83x in three runs of one day). Each speed-up is also given as the median of
  its per-round ratios to the pinned single process. In the same rounds, the codec's work alone, pinned to one
  and to two cores, says how far this machine scales the work that dominates a conversion."""
  output_dir = os.path.join(FLAGS.work_dir, "out-processes")
  convert = lambda count, cores: run_processes(input_dir, output_dir, count, cores, env)
  codec = lambda count, cores: run_codec_processes(input_dir, input_bytes, count, cores)
  settings = [("1 process, pinned to core 0", 1, [0], convert),
              ("2 processes, pinned to cores 0 and 1", 2, [0, 1], convert)]
  settings += [(f"{n} process{'es' if int(n) > 1 else ''}, unpinned", int(n), None, convert)
               for n in FLAGS.processes]
  controls = [("the codec's work alone, 1 process pinned to core 0", 1, [0], codec),
              ("the codec's work alone, 2 processes pinned to cores 0 and 1", 2, [0, 1], codec)]
  walls = {label: [] for label, _, _, _ in settings + controls}
  peaks = {label: [] for label, _, _, _ in settings + controls}
  cpus = {label: [] for label, _, _, _ in settings + controls}
  for _ in range(FLAGS.runs):
    for label, count, cores, run in settings + controls:
      shutil.rmtree(output_dir, ignore_errors=True)
      wall, peak, cpu = run(count, cores)
      print(f"{label}: wall={wall:.1f}s cpu={cpu:.1f}s peak_rss={max(peak, default=0) / 2**30:.2f}GiB", flush=True)
      walls[label].append(wall)
      peaks[label].append(max(peak, default=0))
      cpus[label].append(cpu)
  shutil.rmtree(output_dir, ignore_errors=True)
  # CPU seconds say where a shortfall goes: more work per byte when processes share the machine (the same
  # conversion costing more CPU), or cores left idle (CPU below cores x wall).
  columns = ("processes", "wall (median)", "throughput", "CPU, all processes (median)", "peak RSS per process",
             "speed-up (medians)", "speed-up (median of per-round ratios)")
  rows = []
  for group in (settings, controls):
    pinned_one = walls[group[0][0]]
    for label, _, _, _ in group:
      wall = statistics.median(walls[label])
      paired = statistics.median(one / this for one, this in zip(pinned_one, walls[label]))
      peak = statistics.median(peaks[label])
      rows.append((label, f"{wall:.1f} s", f"{input_bytes / wall / 1e6:.0f} MB/s",
                   f"{statistics.median(cpus[label]):.1f} s", f"{peak / 2**30:.2f} GiB" if peak else "",
                   f"{statistics.median(pinned_one) / wall:.2f}x", f"{paired:.2f}x"))
  table = ResultTable(f"several processes (one device each, {FLAGS.runs} rounds of every setting in turn; the"
                      " speed-ups against the pinned single process)", columns, tuple(rows))
  print_table(table)
  return table


def _bucket_runs(input_dir: str, env: dict[str, str], cgroup: MemoryCgroup | None) -> ResultTable:
  """gs:// -> gs:// conversions of the same model, against the same kind of floor: the input uploaded to the
  bucket and downloaded back (write + read as many bytes)."""
  from converter import storage  # pylint: disable=g-import-not-at-top
  from tools import gcs_emulator  # pylint: disable=g-import-not-at-top

  emulator = None
  if FLAGS.bucket == "emulator":
    emulator = gcs_emulator.GcsEmulator(os.path.join(FLAGS.work_dir, "gcs"))
    emulator.start()
    emulator.create_bucket("hf2maxtext-benchmark")
    env = dict(env, **emulator.env)
    os.environ.update(emulator.env)
    prefix = "gs://hf2maxtext-benchmark/run"
  else:
    prefix = FLAGS.bucket.rstrip("/")
  try:
    storage.configure_emulator(os.environ)
    storage.configure_emulator(env)
    fs = storage.filesystem(prefix)
    remote_input, remote_output = f"{prefix}/input", f"{prefix}/out"
    if fs.exists(remote_input):
      fs.rm(remote_input, recursive=True)
    start = time.monotonic()
    fs.put(input_dir.rstrip("/") + "/", remote_input, recursive=True)
    upload = time.monotonic() - start
    input_bytes = du(input_dir)
    read, write = floors.bucket_floor(remote_input, sorted(os.listdir(input_dir)), f"{prefix}/floor")
    floor = read + write
    where = "fake-gcs-server on 127.0.0.1" if emulator else prefix
    caption = (f"bucket ({where}): input uploaded with gcsfs in {upload:.1f} s; I/O floor {floor:.1f} s (read the"
               f" {input_bytes / 1e9:.2f} GB in 64 MiB ranges {read:.1f} s, write as many bytes as 64 MiB objects"
               f" {write:.1f} s, tensorstore, 8 in flight)")
    print(f"\n{caption}", flush=True)
    rows = []
    for devices in FLAGS.devices:
      walls, peaks = [], []
      for _ in range(FLAGS.runs):
        if fs.exists(remote_output):
          fs.rm(remote_output, recursive=True)
        wall, peak, _ = _run(f"bucket devices={devices}", _convert_command(remote_input, remote_output, devices),
                             env, cgroup)
        walls.append(wall)
        peaks.append(peak)
      rows.append((devices, statistics.median(walls), statistics.median(peaks)))
    columns = ("model", "size", "devices", "scan", "from / to", "wall (median)", "peak RSS", "throughput", "floor",
               "wall / floor")
    table = ResultTable(caption, columns, tuple(
        (FLAGS.family, f"{input_bytes / 1e9:.1f} GB", devices, "on" if FLAGS.scan_layers else "off",
         f"gs:// -> gs:// ({'emulator' if emulator else 'bucket'})", f"{wall:.1f} s", f"{peak / 2**30:.2f} GiB",
         f"{input_bytes / wall / 1e6:.0f} MB/s", f"{floor:.1f} s", f"{wall / floor:.2f}")
        for devices, wall, peak in rows))
    print(markdown_table(table.columns, table.rows), flush=True)
    for path in (remote_output, remote_input):
      if fs.exists(path):
        fs.rm(path, recursive=True)
  finally:
    if emulator:
      emulator.stop()
      shutil.rmtree(emulator.root, ignore_errors=True)
  return table


def _scan(scan_layers: bool) -> str:
  return "on" if scan_layers else "off"


def _relayout_command(items_path: str, output_dir: str, devices: str) -> list[str]:
  """The checkpoint at `items_path` laid out again (MaxText -> MaxText): the other --scan_layers, bfloat16."""
  return [PYTHON, os.path.join(REPO, "converter", "main.py"), "--direction=to_maxtext",
          f"--checkpoint_path={items_path}", f"--output_dir={output_dir}", "--overwrite",
          f"--simulated_cpu_devices_count={devices}", f"--scan_layers={not FLAGS.scan_layers}",
          "--save_dtype=bfloat16", "--noprogress"]


def _reverse_command(items_path: str, output_dir: str) -> list[str]:
  return [PYTHON, os.path.join(REPO, "converter", "main.py"), "--direction=to_huggingface",
          f"--checkpoint_path={items_path}", f"--output_dir={output_dir}", "--noprogress"]


def _push_to_hub(items_path: str, env: dict[str, str], cgroup) -> tuple[float, float, float]:
  """The way back of `items_path` pushed to a fresh repo of a fresh Hub stand-in (nothing uploaded before, so
  every shard is sent): (wall, peak RSS, CPU-s) of the converter."""
  from tools import hub_stand_in  # pylint: disable=g-import-not-at-top

  with hub_stand_in.HubStandIn({}, root_parent=FLAGS.work_dir) as hub:
    hub_env = dict(env, HF_ENDPOINT=hub.url, HF_TOKEN="hf_benchmark", HF_HUB_DISABLE_XET="1")
    result = _run("  back to a Hub repo", _reverse_command(items_path, "hf://benchmark/back"), hub_env, cgroup)
    if len(hub.commits) != 1:
      raise RuntimeError(f"the push made {len(hub.commits)} commits")
    return result


# The columns of the main table, one per cell of `_row` and `_route_rows`.
CONVERSION_COLUMNS = ("conversion", "size", "devices", "scan", "wall (median)", "peak RSS (and --dry_run's)", "output", "throughput",
                      "I/O floor", "compression floor", "wall / max(floors)", "(wall - start-up) / max(floors)",
                      "CPU-s: conversion / codec floor", "(CPU-s - start-up CPU-s) / codec floor",
                      "(CPU-s - start-up CPU-s) / transpose floor")


def _row(label: str, devices: str, wall: float, peak: float, out_bytes: int | str, moved_bytes: int, io: float,
         codec: float | None, start_up: tuple[float, float], note: str = "",
         cpu: tuple[float, float, float] | None = None, predicted_peak: int | None = None,
         scan: str | None = None) -> tuple[str, ...]:
  """One row of CONVERSION_COLUMNS; `cpu`: the conversion's CPU-s, the codec floor's and the transpose floor's;
  `scan`: the scan cell (by default --scan_layers')."""
  out = f"{out_bytes / 1e9:.2f} GB" if isinstance(out_bytes, int) else out_bytes
  floor = max(io, codec or 0.0)
  peak_cell = f"{peak / 2**30:.2f} GiB"
  if predicted_peak:
    peak_cell += f" (--dry_run: {predicted_peak / 2**30:.2f} GiB, {predicted_peak / peak - 1:+.0%})"
  scan = _scan(FLAGS.scan_layers) if scan is None else scan
  return (label, f"{moved_bytes / 1e9:.1f} GB", devices, scan, f"{wall:.1f} s",
          peak_cell, out, f"{moved_bytes / wall / 1e6:.0f} MB/s", f"{io:.1f} s",
          "" if codec is None else f"{codec:.1f} s", f"{wall / floor:.2f}{note}", f"{(wall - start_up[0]) / floor:.2f}",
          "" if cpu is None else f"{cpu[0]:.1f} / " + ("-" if cpu[1] is None else f"{cpu[1]:.1f}"),
          "" if cpu is None or cpu[1] is None else f"{(cpu[0] - start_up[1]) / cpu[1]:.2f}",
          "" if cpu is None or cpu[2] is None else f"{(cpu[0] - start_up[1]) / cpu[2]:.2f}")


DRY_RUN_COLUMNS = ("plan", "size", "devices", "scan", "wall (median)", "peak RSS", "CPU-s",
                   "predicted peak RSS of the conversion")


def _full_size_dry_runs(env: dict[str, str]) -> ResultTable:
  """`--dry_run` on the family's full-size model written sparse: headers parsed, every tensor paired and checked,
  the plan built, no weight read."""
  if FLAGS.family not in synthetic_checkpoint.FULL_SIZE:
    sys.exit(f"--full_size_dry_run: no full-size model of {FLAGS.family}; families with one:"
             f" {', '.join(sorted(synthetic_checkpoint.FULL_SIZE))}")
  config = synthetic_checkpoint.FULL_SIZE[FLAGS.family]()
  input_dir = os.path.join(FLAGS.work_dir, f"{FLAGS.family}-full-size")
  shapes = list(synthetic_checkpoint.FAMILIES[FLAGS.family][1](config))
  if not (FLAGS.keep_input and os.path.exists(os.path.join(input_dir, "model.safetensors.index.json"))):
    shutil.rmtree(input_dir, ignore_errors=True)
    start = time.monotonic()
    synthetic_checkpoint.write_checkpoint(input_dir, config, shapes, max_shard_bytes=FLAGS.shard_mb << 20,
                                          sparse=True)
    print(f"wrote {FLAGS.family} at full size, sparse, to {input_dir} in {time.monotonic() - start:.1f} s",
          flush=True)
  nbytes = du(input_dir)
  rows = []
  for devices in FLAGS.devices:
    outputs: list[str] = []
    runs = [_run(f"--dry_run devices={devices}", _convert_command(input_dir, os.path.join(FLAGS.work_dir, "out"),
                                                                 devices, "--dry_run"), env, None, outputs)
            for _ in range(FLAGS.runs)]
    wall, peak, cpu = (statistics.median(run[k] for run in runs) for k in range(3))
    predicted = dry_run_lines(outputs[-1])["predicted peak RSS"]
    print(f"--dry_run devices={devices}: predicted peak RSS {predicted / 2**30:.2f} GiB", flush=True)
    rows.append((f"{FLAGS.family} full size, --dry_run", f"{nbytes / 1e9:.1f} GB", devices,
                 "on" if FLAGS.scan_layers else "off", f"{wall:.1f} s", f"{peak / 2**30:.2f} GiB", f"{cpu:.1f}",
                 f"{predicted / 2**30:.2f} GiB"))
  return ResultTable(f"input {nbytes / 1e9:.1f} GB, {len(shapes):,} tensors, written sparse (headers, holes for the"
                     " data)", DRY_RUN_COLUMNS, tuple(rows))


def dry_run_peak(command: list[str], env: dict[str, str]) -> int:
  """The peak RSS `command` + `--dry_run` predicts (from config.json and the headers alone), in bytes."""
  return dry_run(command, env, "predicted peak RSS")[0]


def main(argv: list[str]) -> None:
  del argv  # The page records sys.argv: absl leaves it whole, and argv here lacks the flags.
  started = datetime.datetime.now(datetime.timezone.utc)
  if FLAGS.full_size_dry_run:
    tables = [_full_size_dry_runs(child_env())]
    print_table(tables[0])
    _add_to_results_page(tables, started)
    return
  target = int(FLAGS.size_gb * 1e9)
  shards = "" if FLAGS.shard_mb == 4096 else f"-{FLAGS.shard_mb}mb-shards"
  input_dir = os.path.join(FLAGS.work_dir, f"{FLAGS.family}-{FLAGS.size_gb:g}gb{shards}")
  if not (FLAGS.keep_input and os.path.exists(os.path.join(input_dir, "model.safetensors.index.json"))):
    shutil.rmtree(input_dir, ignore_errors=True)
    start = time.monotonic()
    config, written = synthetic_checkpoint.write_family_checkpoint(input_dir, FLAGS.family, target,
                                                                   max_shard_bytes=FLAGS.shard_mb << 20)
    layers = config.get("text_config", config)["num_hidden_layers"]
    print(f"wrote {written / 1e9:.2f} GB synthetic {FLAGS.family} ({layers} layers) to"
          f" {input_dir} in {time.monotonic() - start:.1f} s", flush=True)
  with open(os.path.join(input_dir, "config.json")) as f:
    # Also inside text_config (Kimi K2.5 / K2.6's wrapper).
    quantized = quant_method(json.load(f)) is not None
  native = quantized and _has_native_fp8(input_dir)
  output_dir = os.path.join(FLAGS.work_dir, "out")
  back_dir = os.path.join(FLAGS.work_dir, "back")
  copy_dir = os.path.join(FLAGS.work_dir, "dequantized")
  env = child_env()
  cgroup = MemoryCgroup(int(FLAGS.memory_limit_gib * 2**30)) if FLAGS.memory_limit_gib else None
  input_files = files(input_dir, ".safetensors")
  input_bytes = du(input_dir)
  output_floor_bytes = input_bytes * (2 if quantized else 1)  # FP8 becomes bfloat16.
  io_floors, native_floors, codec_floors, reverse_floors = [], [], [], []  # codec: (encode, decode, their CPU-s)
  relayout_floors, relayout_encode_floors = [], []  # I/O; the dequantized copy encoded at the relayout's level.
  copy_floors = []  # A plain copy of the bytes the conversion transposes: (seconds, CPU-s).
  median = lambda runs, k: statistics.median(r[k] for r in runs)
  rows, native_rows, reverse_rows, lora_rows, variant_rows, variant_reverse_rows = [], [], [], [], [], []
  relayout_rows, hub_rows = [], []
  relayout_dir = os.path.join(FLAGS.work_dir, "relayout")
  adapter_dir = os.path.join(FLAGS.work_dir, f"lora-r{FLAGS.lora_rank}")
  if FLAGS.lora_rank:
    from converter.sources import open_safetensors  # pylint: disable=g-import-not-at-top
    from tools import lora_adapters  # pylint: disable=g-import-not-at-top

    modules = [name[: -len(".weight")] for name, tensor in sorted(open_safetensors(input_dir).tensors.items())
               if name.endswith("_proj.weight") and ".experts." not in name and len(tensor.shape) == 2]
    lora_adapters.write_random_adapter(input_dir, adapter_dir, tuple(modules), r=FLAGS.lora_rank,
                                       lora_alpha=2 * FLAGS.lora_rank)
    print(f"wrote a rank-{FLAGS.lora_rank} LoRA adapter of {len(modules)} modules to {adapter_dir}", flush=True)
  for devices in FLAGS.devices:
    walls, peaks, cpus, routes, native_runs, reverse_runs, lora_runs = [], [], [], [], [], [], []
    variant_runs, variant_reverse_runs, relayout_runs, hub_runs = [], [], [], []
    relayout_command = _relayout_command(os.path.join(output_dir, "0", "items"), relayout_dir, devices)
    relayout_predicted_peak = None
    predicted_peak, transposed = dry_run(_convert_command(input_dir, output_dir, devices), env,
                                            "predicted peak RSS", "transposed bytes")
    lora_command = _convert_command(input_dir, output_dir, devices, f"--lora_adapter_path={adapter_dir}")
    lora_predicted_peak = dry_run_peak(lora_command, env) if FLAGS.lora_rank else None
    for _ in range(FLAGS.runs):
      shutil.rmtree(output_dir, ignore_errors=True)  # Disk: input + the floor's copy must fit, not + output too.
      io_floors.append(floors.in_child(floors.io_floor, input_files, output_floor_bytes, FLAGS.work_dir))
      if not quantized:
        codec_floors.append(floors.in_child(floors.compression_floors, input_dir, output_floor_bytes, FLAGS.work_dir))
      copy_floors.append(floors.in_child(floors.copy_floor, input_dir, transposed))
      if FLAGS.variant_flags:  # First, so that the default's output is there for the rows below.
        variant_runs.append((*_run(f"  {' '.join(FLAGS.variant_flags)}", _convert_command(
            input_dir, output_dir, devices, *FLAGS.variant_flags), env, cgroup), du(output_dir)))
        if FLAGS.reverse:
          shutil.rmtree(back_dir, ignore_errors=True)
          floors.warm(output_dir)
          variant_reverse_runs.append((*_run("  back to HuggingFace", _reverse_command(
              os.path.join(output_dir, "0", "items"), back_dir), env, cgroup), du(back_dir)))
        shutil.rmtree(output_dir, ignore_errors=True)
      wall, peak, cpu = _run(f"devices={devices}", _convert_command(input_dir, output_dir, devices), env, cgroup)
      walls.append(wall)
      peaks.append(peak)
      cpus.append(cpu)
      out_bytes = du(output_dir)
      if FLAGS.reverse:
        shutil.rmtree(back_dir, ignore_errors=True)
        floors.warm(output_dir)
        reverse_wall, reverse_peak, reverse_cpu = _run("  back to HuggingFace", _reverse_command(
            os.path.join(output_dir, "0", "items"), back_dir), env, cgroup)
        back_bytes = du(back_dir)
        shutil.rmtree(back_dir, ignore_errors=True)
        reverse_floors.append(floors.in_child(floors.io_floor, files(output_dir), back_bytes, FLAGS.work_dir))
        reverse_runs.append((reverse_wall, reverse_peak, back_bytes, reverse_cpu))
        if FLAGS.hub:
          hub_runs.append((*_push_to_hub(os.path.join(output_dir, "0", "items"), env, cgroup), back_bytes))
      if FLAGS.relayout:
        if relayout_predicted_peak is None:  # Planned from the output's metadata: once it is there.
          relayout_predicted_peak = dry_run_peak(relayout_command, env)
        shutil.rmtree(relayout_dir, ignore_errors=True)
        floors.warm(output_dir)
        relayout_wall, relayout_peak, relayout_cpu = _run(
            f"  MaxText -> MaxText, scan {_scan(FLAGS.scan_layers)} -> {_scan(not FLAGS.scan_layers)}",
            relayout_command, env, cgroup)
        relayout_bytes = du(relayout_dir)
        shutil.rmtree(relayout_dir, ignore_errors=True)
        relayout_floors.append(floors.in_child(floors.io_floor, files(output_dir), relayout_bytes, FLAGS.work_dir))
        relayout_runs.append((relayout_wall, relayout_peak, relayout_cpu, relayout_bytes))
      if FLAGS.lora_rank:
        shutil.rmtree(output_dir, ignore_errors=True)
        lora_runs.append((*_run("  --lora_adapter_path", lora_command, env, cgroup), du(output_dir)))
      if native:
        shutil.rmtree(output_dir, ignore_errors=True)
        native_floors.append(floors.in_child(floors.io_floor, input_files, input_bytes, FLAGS.work_dir))
        # MaxText's fp8 models have no multimodal form: the wrapper's tower stays out of the native conversion.
        native_command = _convert_command(input_dir, output_dir, devices, "--keep_fp8", "--text_only")
        native_wall, native_peak, _ = _run("  --keep_fp8", native_command, env, cgroup)
        native_runs.append((native_wall, native_peak, du(output_dir)))
      if quantized and FLAGS.maxtext_route:
        shutil.rmtree(output_dir, ignore_errors=True)
        shutil.rmtree(copy_dir, ignore_errors=True)
        dequantize = [PYTHON, os.path.join(REPO, "tools", "dequantize_checkpoint.py"), f"--input={input_dir}",
                      f"--output={copy_dir}"]
        pass_wall, pass_peak, _ = _run("  dequantize pass", dequantize, env, cgroup)
        # The codec's floor on the bytes the conversion writes: dequantized weights compress unlike the packed
        # FP8 input (zstd took 3x as long per byte on DeepSeek-shaped ones).
        copy_bytes = sum(os.path.getsize(f) for f in files(copy_dir, ".safetensors"))
        codec_floors.append(floors.in_child(floors.compression_floors, copy_dir, copy_bytes, FLAGS.work_dir, 0, 1,
                                            True, default_zstd_level(dequantizing=True)))
        if FLAGS.relayout:  # A MaxText source is not dequantized: the relayout encodes at the other level.
          relayout_encode_floors.append(floors.in_child(floors.compression_floors, copy_dir, copy_bytes,
                                                        FLAGS.work_dir, 0, 1, False,
                                                        default_zstd_level(dequantizing=False)))
        # At the direct conversion's level: the copy is bf16, which the converter would otherwise store at the
        # level of weights read as trained, and the route would store more bytes than the conversion it is against.
        copy_command = _convert_command(copy_dir, output_dir, devices,
                                        f"--zstd_level={default_zstd_level(dequantizing=True)}")
        copy_wall, copy_peak, _ = _run("  convert the bf16 copy", copy_command, env, cgroup)
        routes.append((pass_wall, pass_peak, copy_wall, copy_peak))
        shutil.rmtree(copy_dir, ignore_errors=True)
    rows.append((devices, statistics.median(walls), statistics.median(peaks), out_bytes,
                 [median(routes, k) for k in range(4)] if routes else None, statistics.median(cpus), predicted_peak))
    if native_runs:
      native_rows.append((devices, *(median(native_runs, k) for k in range(3))))
    if reverse_runs:
      reverse_rows.append((devices, *(median(reverse_runs, k) for k in range(4))))
    if hub_runs:
      hub_rows.append((devices, *(median(hub_runs, k) for k in range(4))))
    if lora_runs:
      lora_rows.append((devices, *(median(lora_runs, k) for k in range(4)), lora_predicted_peak))
    if variant_runs:
      variant_rows.append((devices, *(median(variant_runs, k) for k in range(4))))
    if variant_reverse_runs:
      variant_reverse_rows.append((devices, *(median(variant_reverse_runs, k) for k in range(4))))
    if relayout_runs:
      relayout_rows.append((devices, *(median(relayout_runs, k) for k in range(4)), relayout_predicted_peak))
  shutil.rmtree(output_dir, ignore_errors=True)
  io = statistics.median(io_floors)
  copy_cpu = median(copy_floors, 1)
  if codec_floors:
    encode, decode, encode_cpu, decode_cpu = (median(codec_floors, k) for k in range(4))
    # Each direction's CPU floors: the codec's, and the transpose floor (the codec's plus a plain copy).
    to_maxtext_floors, back_floors = (encode_cpu, encode_cpu + copy_cpu), (decode_cpu, decode_cpu + copy_cpu)
    codec_caption = (
        f"compression floor (the {'dequantized copy' if quantized else f'{output_floor_bytes / 1e9:.2f} GB'}"
        f" through zstd level {default_zstd_level(dequantizing=quantized)} (the conversions' default) in a zarr3"
        f" array, via tensorstore on every core, from a file map by reference,"
        f" in {chunking.ChunkRule.max_chunk_bytes >> 20} MiB chunks)"
        f" median {encode:.1f} s ({encode_cpu:.1f} CPU-s), decompression (reading them back into a file, synced)"
        f" {decode:.1f} s ({decode_cpu:.1f} CPU-s); transpose floor (the codec's CPU-s plus a plain copy of the"
        f" {transposed / 1e9:.2f} GB the conversion transposes, {copy_cpu:.2f} CPU-s) {to_maxtext_floors[1]:.1f}"
        f" CPU-s to MaxText, {back_floors[1]:.1f} back")
  else:  # --nomaxtext_route on a quantized input: no dequantized copy to take the codec's floor on.
    encode = decode = encode_cpu = decode_cpu = None
    to_maxtext_floors = back_floors = (None, None)
    codec_caption = (f"compression floor not measured (--nomaxtext_route: no dequantized copy); a plain copy of the"
                     f" {transposed / 1e9:.2f} GB the conversion transposes {copy_cpu:.2f} CPU-s")
  start_up = start_up_cost(3)
  caption = (f"input {input_bytes / 1e9:.2f} GB; I/O floor (read the input + write"
             f" {output_floor_bytes / 1e9:.2f} GB, fsync) median {io:.1f} s; {codec_caption}; start-up"
             f" (the bundled tiny checkpoint) {start_up.wall:.2f} s ({start_up.cpu:.2f} CPU-s), its first block read"
             f" {start_up.first_read:.2f} s after the process started; back to HuggingFace {start_up.reverse_wall:.2f} s"
             f" ({start_up.reverse_cpu:.2f} CPU-s)")
  forward_start_up, reverse_start_up = (start_up.wall, start_up.cpu), (start_up.reverse_wall, start_up.reverse_cpu)
  # The floors are the work alone; the "- start-up" columns take the start-up out of the conversion too: on a
  # checkpoint of a few GB it is a fifth of the floor, on one of a TB nothing. CPU seconds say which wall is bound
  # by work (CPU near cores x wall: only less work per byte helps) and which by waiting (cores left idle).
  table_rows = [_row(f"{FLAGS.family} -> MaxText", devices, wall, peak, out_bytes, input_bytes, io, encode,
                     forward_start_up, cpu=(cpu, *to_maxtext_floors), predicted_peak=predicted)
                for devices, wall, peak, out_bytes, _, cpu, predicted in rows]
  if reverse_rows:
    reverse_io = statistics.median(reverse_floors)
    table_rows += [_row("MaxText -> HuggingFace", devices, wall, peak, back_bytes, back_bytes, reverse_io, decode,
                        reverse_start_up, cpu=(cpu, *back_floors))
                   for devices, wall, peak, back_bytes, cpu in reverse_rows]
    table_rows += [_row("MaxText -> HuggingFace, pushed to a Hub repo (the stand-in, LFS)", devices, wall, peak,
                        back_bytes, back_bytes, reverse_io, decode, reverse_start_up, cpu=(cpu, *back_floors))
                   for devices, wall, peak, cpu, back_bytes in hub_rows]
  table_rows += [_row(f"{FLAGS.family} -> MaxText, a rank-{FLAGS.lora_rank} LoRA adapter merged", devices, wall, peak,
                     out_bytes, input_bytes, io, encode, forward_start_up, cpu=(cpu, *to_maxtext_floors),
                     predicted_peak=predicted)
                 for devices, wall, peak, cpu, out_bytes, predicted in lora_rows]
  table_rows += [_row(f"{FLAGS.family} -> MaxText, {' '.join(FLAGS.variant_flags)}", devices, wall, peak, out_bytes,
                      input_bytes, io, encode, forward_start_up, cpu=(cpu, *to_maxtext_floors))
                 for devices, wall, peak, cpu, out_bytes in variant_rows]
  if variant_reverse_rows:
    table_rows += [_row(f"MaxText -> HuggingFace, from {' '.join(FLAGS.variant_flags)}", devices, wall, peak,
                        back_bytes, back_bytes, reverse_io, decode, reverse_start_up,
                        cpu=(cpu, *back_floors))
                   for devices, wall, peak, cpu, back_bytes in variant_reverse_rows]
  if relayout_rows:
    # Decoding the source's chunks and encoding the output's: the decompression floor plus the compression floor
    # at the relayout's level (for a dequantized input, the copy encoded again at that level).
    relayout_encode, relayout_encode_cpu = ((median(relayout_encode_floors, 0), median(relayout_encode_floors, 2))
                                            if relayout_encode_floors else (encode, encode_cpu))
    relayout_codec = None if decode is None or relayout_encode is None else relayout_encode + decode
    relayout_codec_cpu = None if decode_cpu is None or relayout_encode_cpu is None else relayout_encode_cpu + decode_cpu
    relayout_io = statistics.median(relayout_floors)
    scan = f"{_scan(FLAGS.scan_layers)} -> {_scan(not FLAGS.scan_layers)}"
    table_rows += [_row("MaxText -> MaxText (--checkpoint_path, bfloat16)", devices, wall, peak, out_bytes,
                        output_floor_bytes, relayout_io, relayout_codec, forward_start_up,
                        cpu=(cpu, relayout_codec_cpu, None), predicted_peak=predicted, scan=scan)
                   for devices, wall, peak, cpu, out_bytes, predicted in relayout_rows]
    caption += (f"; MaxText -> MaxText: I/O floor (read the checkpoint + write as many bytes as the relayout, fsync)"
                f" median {relayout_io:.1f} s, codec floor (decompression + compression"
                f" at level {default_zstd_level(dequantizing=False)})"
                + (" not measured" if relayout_codec is None else
                   f" {relayout_codec:.1f} s ({relayout_codec_cpu:.1f} CPU-s)"))
  if native_rows:
    native_floor = statistics.median(native_floors)
    table_rows += [_row(f"{FLAGS.family} -> MaxText, --keep_fp8 (native fp8 output)", devices, wall, peak, out_bytes,
                        input_bytes, native_floor, None, forward_start_up, " (I/O)")
                   for devices, wall, peak, out_bytes in native_rows]
  table_rows += _route_rows(rows, input_bytes, io, encode)
  tables = [ResultTable(caption, CONVERSION_COLUMNS, tuple(table_rows))]
  print_table(tables[0])
  if FLAGS.processes:
    tables.append(_scaling_runs(input_dir, input_bytes, env))
  if FLAGS.bucket:
    tables.append(_bucket_runs(input_dir, env, cgroup))
  notes = []
  if cgroup:
    cgroup.remove()
    notes.append(f"every conversion ran in a memory cgroup limited to {FLAGS.memory_limit_gib:g} GiB")
    print(f"\n{notes[-1]}")
  _add_to_results_page(tables, started, notes)


def _add_to_results_page(tables: Sequence[ResultTable], started: datetime.datetime, notes: Sequence[str] = ()) -> None:
  if FLAGS.results_page:
    section = render_run_section(tables, started, machine_description(), command_line(sys.argv, "//tools:benchmark"), notes)
    print(f"\nresults added to {RESULTS_PAGE.write(FLAGS.results_page, section)}")


def _route_rows(rows: list, input_bytes: int, io: float, zstd: float) -> list[tuple[str, ...]]:
  """The rows of MaxText's own route for a quantized input (a dequantize pass, then the conversion of its copy),
  in the main table's columns."""
  floor = max(io, zstd or 0.0)
  table_rows = []
  for devices, wall, _, _, route, _, _ in rows:
    if route:
      pass_wall, pass_peak, copy_wall, copy_peak = route
      table_rows.append((
          f"{FLAGS.family} -> MaxText, dequantize-then-convert (MaxText's route)", f"{input_bytes / 1e9:.1f} GB",
          devices, "on" if FLAGS.scan_layers else "off",
          f"{pass_wall + copy_wall:.1f} s ({pass_wall:.1f} s pass + {copy_wall:.1f} s conversion)",
          f"{max(pass_peak, copy_peak) / 2**30:.2f} GiB (bf16 conversion {copy_peak / 2**30:.2f} GiB)", "", "",
          f"{io:.1f} s", f"{zstd:.1f} s",
          f"{(pass_wall + copy_wall) / floor:.2f} ({(pass_wall + copy_wall) / wall:.2f}x the direct conversion)", "",
          "", "", ""))
  return table_rows


if __name__ == "__main__":
  app.run(main)
