"""Whole-model conversions with the converter's memory sampled from start to end: is it flat in the bytes written?

  bazel run //tools:memory_benchmark -- --model=deepseek3_whole
  bazel run //tools:memory_benchmark -- --model=kimi_k26_whole
  bazel run //tools:memory_benchmark -- --model=kimi_k26_random --moe_layers=2 --relayout --nokeep_input

Each model's input is written by tools/synthetic_checkpoint.py: `*_whole` is the real model at full size, written
sparse (headers, and holes that read as zeros: a 685B or 1T model on a small disk; its zeros compress to almost
nothing, so the output is small too); `kimi_k26_random` is Kimi-K2.6 at its real widths with `--moe_layers` layers
of random INT4 experts, which expand 4x into bfloat16 (the stored bytes follow the values, which the zeros may
hide). The converter runs with its default flags as a user runs it, after `--dry_run` on the same command; its
process tree's RSS is sampled every 20 ms. `--relayout` then lays the output out again (MaxText -> MaxText, scan
flipped), sampled the same way.

For each run it prints, and adds to `--results_page` (dated, newest first) with a plot under `--plot_dir` (time
across, RSS up, the dry run's prediction and the 1 GiB line drawn in): wall, CPU-s, bytes written and stored, the
peak RSS beside the prediction, and the highest RSS over the second and over the last fifth of the run, whose
ratio says whether memory grows with the bytes written (the first fifth is start-up and the dense layers).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence

from absl import app, flags

from tools import synthetic_checkpoint
from tools.benchmark_runner import (CONVERTER, ResultsPage, ResultTable, child_env, command_line, dry_run, du,
                                    machine_description, measure, print_table, render_run_section, workspace_path)

FLAGS = flags.FLAGS
MODELS = ("deepseek3_whole", "kimi_k26_whole", "kimi_k26_random")
flags.DEFINE_enum("model", "deepseek3_whole", MODELS, "Which model to convert (module docstring).")
flags.DEFINE_integer("moe_layers", 3, "kimi_k26_random: MoE layers of 384 random INT4 experts (8.45 GB each in,"
                     " 33.8 GB of bfloat16 out, about 17 GB of it stored).")
flags.DEFINE_integer("experts", 384, "kimi_k26_random: routed experts per MoE layer (Kimi-K2.6 has 384; fewer sizes"
                     " a run between whole layers, each expert 22 MB in and 88 MB of bfloat16 out).")
flags.DEFINE_string("work_dir", "/tmp/hf2maxtext-memory-benchmark", "Where the synthetic checkpoint and outputs go.")
flags.DEFINE_boolean("keep_input", True, "Reuse a synthetic checkpoint of the same model and size if present.")
flags.DEFINE_boolean("keep_output", False, "Leave the outputs in --work_dir (removed after each run by default).")
flags.DEFINE_boolean("relayout", False, "Also lay the output out again (MaxText -> MaxText, scan off), sampled the"
                     " same way; with --nokeep_input the input is removed first.")
flags.DEFINE_enum("compression", "zstd", ["zstd", "none"], "The converter's --compression: none stores the"
                  " bfloat16 as written, 4x an INT4 input (the most stored bytes a disk's input allows).")
flags.DEFINE_float("input_tmpfs_gb", 0, "GB of the synthetic input's shards moved to --tmpfs_dir and symlinked from"
                   " the input directory, so that a random run's input and its output fit one disk; those shards are"
                   " removed at the end of the run, the rest of the input kept as --keep_input says.")
flags.DEFINE_string("tmpfs_dir", "/dev/shm/hf2maxtext-memory-benchmark", "Where --input_tmpfs_gb puts shards.")
flags.DEFINE_string("plot_dir", "docs/memory", "Where each run's plot (PNG) goes, beside the results page.")
flags.DEFINE_string("results_page", "docs/memory-results.md", "Markdown page each run is added to, newest first.")

GIB = 1 << 30
COLUMNS = ("run", "written", "stored", "wall", "CPU-s", "peak RSS", "--dry_run", "prediction off by",
           "max RSS, 2nd fifth", "max RSS, last fifth", "last / 2nd", "plot")
RESULTS_PAGE = ResultsPage(
    "# Memory over whole-model conversions",
    "Written by `tools/memory_benchmark.py` at the end of every run (what it measures:"
    " [memory-and-streaming.md](memory-and-streaming.md#flat-to-the-last-byte)).",
    "<!-- tools/memory_benchmark.py adds each run below this line, newest first. -->")


def write_input(model: str, moe_layers: int, directory: str) -> tuple[str, int]:
  """The model's synthetic HF checkpoint in `directory` (reused when present and --keep_input); its label and
  input bytes."""
  if model == "deepseek3_whole":
    config, sparse, label = synthetic_checkpoint.deepseek3_full_config(), True, "DeepSeek-V3 685B whole, sparse"
    shapes = list(synthetic_checkpoint.deepseek3_fp8_shapes(config))
  elif model == "kimi_k26_whole":
    config, sparse, label = synthetic_checkpoint.kimi_k26_config(), True, "Kimi-K2.6 1T whole, sparse"
    shapes = list(synthetic_checkpoint.kimi_k26_shapes(config))
  else:
    config = synthetic_checkpoint.kimi_k26_config(layers=1 + moe_layers, experts=FLAGS.experts, vocab=16384)
    sparse, label = False, f"Kimi-K2.6 widths, {moe_layers} MoE layers of {FLAGS.experts} experts, random INT4"
    shapes = list(synthetic_checkpoint.kimi_k26_shapes(config))
  if not (FLAGS.keep_input and _complete(directory)):
    shutil.rmtree(directory, ignore_errors=True)
    start = time.monotonic()
    synthetic_checkpoint.write_checkpoint(directory, config, shapes, sparse=sparse)
    print(f"wrote {label} to {directory} in {time.monotonic() - start:.0f} s", flush=True)
  return label, sum(synthetic_checkpoint.tensor_bytes(t) for t in shapes)


def _complete(directory: str) -> bool:
  """Whether `directory` holds a whole synthetic checkpoint: its index, and every shard it names (a shard moved to
  tmpfs by an earlier run is gone once that run ended)."""
  try:
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
      shards = set(json.load(f)["weight_map"].values())
  except FileNotFoundError:
    return False
  return all(os.path.exists(os.path.join(directory, shard)) for shard in shards)


def move_to_tmpfs(directory: str, tmpfs_dir: str, budget: int) -> list[str]:
  """Moves whole shards of `directory`, largest first, to `tmpfs_dir` while they fit `budget` bytes, each left as a
  symlink; returns the moved files. The converter maps a tmpfs file as it maps one on disk (its pages count in RSS
  while mapped and are dropped the same way), so where a shard lies does not change what is measured."""
  shards = sorted((entry for entry in os.scandir(directory)
                   if entry.name.endswith(".safetensors") and not entry.is_symlink()),
                  key=lambda entry: entry.stat().st_size, reverse=True)
  os.makedirs(tmpfs_dir, exist_ok=True)
  moved: list[str] = []
  for entry in shards:
    size = entry.stat().st_size
    if size > budget:
      continue
    target = os.path.join(tmpfs_dir, entry.name)
    shutil.move(entry.path, target)
    os.symlink(target, entry.path)
    moved.append(target)
    budget -= size
  return moved


def fifth_peaks(trace: Sequence[tuple[float, int]]) -> tuple[int, int]:
  """The highest RSS over the second fifth and over the last fifth of the run's wall time."""
  end = trace[-1][0]
  second = [rss for t, rss in trace if end / 5 <= t < 2 * end / 5]
  last = [rss for t, rss in trace if t >= 4 * end / 5]
  return max(second, default=0), max(last, default=0)


def draw(trace: Sequence[tuple[float, int]], predicted: int, title: str, path: str) -> None:
  """RSS over time, the prediction and the 1 GiB line, as a PNG at `path` (matplotlib: a benchmark dependency,
  never the converter's)."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top

  figure, axes = pyplot.subplots(figsize=(9, 4), dpi=100)
  minutes = [t / 60 for t, _ in trace]
  axes.plot(minutes, [rss / 2**20 for _, rss in trace], linewidth=0.8, label="RSS of the converter's process tree")
  axes.axhline(predicted / 2**20, color="tab:orange", linestyle="--", label=f"--dry_run {predicted / 2**20:.0f} MiB")
  axes.axhline(1024, color="tab:red", linestyle=":", label="1 GiB")
  for fifth in (1, 2, 4):
    axes.axvline(minutes[-1] * fifth / 5, color="0.8", linewidth=0.6)
  axes.set_xlabel("minutes")
  axes.set_ylabel("MiB")
  axes.set_ylim(0, 1152)
  axes.set_title(title, fontsize=10)
  axes.legend(loc="lower right", fontsize=8)
  figure.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  figure.savefig(path)
  pyplot.close(figure)


def measured_run(label: str, command: list[str], output_dir: str, plot: str) -> tuple[str, ...]:
  """`command`'s dry run, then the command sampled; its row of the table, its plot drawn at `plot`."""
  predicted, written = dry_run(command, child_env(), "predicted peak RSS", "bytes to write")
  trace: list[tuple[float, int]] = []
  measured = measure(label, command, trace=trace)
  wall, peak, cpu = measured.wall, measured.peak, measured.cpu
  second, last = fifth_peaks(trace)
  stored = du(output_dir)
  print(f"{label}: wall {wall:.0f} s, {cpu:.0f} CPU-s, peak {peak / GIB:.2f} GiB (predicted"
        f" {predicted / GIB:.2f}), second fifth {second / 2**20:.0f} MiB, last {last / 2**20:.0f} MiB", flush=True)
  draw(trace, predicted, f"{label}: {written / 1e12:.2f} TB written", workspace_path(plot))
  rel = os.path.relpath(workspace_path(plot), os.path.dirname(workspace_path(FLAGS.results_page)))
  return (label, f"{written / 1e9:,.0f} GB", f"{stored / 1e9:,.1f} GB", f"{wall / 60:.1f} min", f"{cpu:,.0f}",
          f"{peak / 2**20:.0f} MiB", f"{predicted / 2**20:.0f} MiB", f"{(predicted - peak) / peak:+.0%}",
          f"{second / 2**20:.0f} MiB", f"{last / 2**20:.0f} MiB", f"{last / second:.3f}" if second else "-",
          f"[png]({rel})")


def main(argv: Sequence[str]) -> None:
  del argv
  started = datetime.datetime.now(datetime.timezone.utc)
  stamp = started.strftime("%Y%m%d-%H%M")
  input_dir = os.path.join(FLAGS.work_dir, FLAGS.model + (f"-{FLAGS.moe_layers}x{FLAGS.experts}" if "random" in FLAGS.model
                                                          else ""))
  label, input_bytes = write_input(FLAGS.model, FLAGS.moe_layers, input_dir)
  on_tmpfs = move_to_tmpfs(input_dir, FLAGS.tmpfs_dir, int(FLAGS.input_tmpfs_gb * 1e9)) if FLAGS.input_tmpfs_gb else []
  try:
    _runs(label, input_bytes, input_dir, started, stamp)
  finally:
    for path in on_tmpfs:
      os.remove(path)
    if FLAGS.input_tmpfs_gb:
      with contextlib.suppress(OSError):  # Left when something else is in it.
        os.rmdir(FLAGS.tmpfs_dir)


def _runs(label: str, input_bytes: int, input_dir: str, started: datetime.datetime, stamp: str) -> None:
  """The conversion, and with --relayout its re-layout, each sampled; their table added to the results page."""
  output_dir = os.path.join(FLAGS.work_dir, "out")
  rows = []
  forward = [*CONVERTER, f"--hf_model_path={input_dir}", f"--output_dir={output_dir}", "--overwrite", "--noprogress",
             f"--compression={FLAGS.compression}"]
  plot = os.path.join(FLAGS.plot_dir, f"{stamp}-{FLAGS.model}.png")
  items = os.path.join(output_dir, "0", "items")
  rows.append(measured_run(label, forward, output_dir, plot))
  if FLAGS.relayout:
    if not FLAGS.keep_input:  # The re-layout reads the output alone: the disk holds the output and its re-layout.
      shutil.rmtree(input_dir, ignore_errors=True)
    relaid = os.path.join(FLAGS.work_dir, "relayout")
    command = [*CONVERTER, f"--checkpoint_path={items}", f"--output_dir={relaid}", "--overwrite", "--noprogress",
               "--noscan_layers", f"--compression={FLAGS.compression}"]
    rows.append(measured_run(f"{label}, re-laid out (scan off)", command, relaid,
                             os.path.join(FLAGS.plot_dir, f"{stamp}-{FLAGS.model}-relayout.png")))
    if not FLAGS.keep_output:
      shutil.rmtree(relaid, ignore_errors=True)
  if not FLAGS.keep_output:
    shutil.rmtree(output_dir, ignore_errors=True)
  flags_used = "default flags" + (", --compression=none" if FLAGS.compression == "none" else "")
  table = ResultTable(f"input {input_bytes / 1e9:,.1f} GB as the hub ships it; {flags_used} (128 MiB budget, scan"
                      " on, 16 lazy devices); RSS of the whole process tree every 20 ms", COLUMNS, tuple(rows))
  print_table(table)
  section = render_run_section([table], started, machine_description(),
                               command_line(sys.argv, "//tools:memory_benchmark"))
  print(f"added to {RESULTS_PAGE.write(FLAGS.results_page, section)}", flush=True)


if __name__ == "__main__":
  app.run(main)
