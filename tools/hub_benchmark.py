"""A conversion straight from the Hub against its two floors, over a limited link:

  bazel run //tools:hub_benchmark -- --size_gb=3 --runs=3

The Hub stand-in (tools/hub_stand_in.py) serves a synthetic Qwen3-MoE checkpoint on 127.0.0.1 as the Hub does (a
redirect to a storage host that answers range requests), behind a link with a cap per connection, a latency per
request and a cap on all connections together (`--per_connection_mb_s`, `--latency_ms`, `--aggregate_mb_s`). Each
round runs, in alternating order:

- download: huggingface_hub's own `snapshot_download` of the files a conversion reads, with its parallel workers
  (floor a: what the link gives);
- local: converting the same files from local disk (floor b: what the conversion costs);
- hub: `--hf_model_path=ORG/NAME`, the weights read by ranges while converting;
- download first: `--hub_download_first`, the path before ranged reads (the download, then the conversion).

It prints and adds to `--results_page` (dated, newest first) the medians, hub over the longer floor (the goal:
within 1.10x), download first over the floors' sum, bytes fetched over bytes needed, requests, peak RSS and peak
local disk (the HF cache and TMPDIR), with a plot of the last round's RSS and local disk over time.
"""

from __future__ import annotations

import datetime
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Sequence

from absl import app, flags

from tools import hub_stand_in, synthetic_checkpoint
from tools.benchmark_runner import (CONVERTER, PYTHON, ResultsPage, ResultTable, alternating, child_env,
                                    command_line, dry_run, machine_description, measure, print_table,
                                    render_run_section, workspace_path)

FLAGS = flags.FLAGS
flags.DEFINE_float("size_gb", 3.0, "Size of the synthetic Qwen3-MoE checkpoint (bfloat16).")
flags.DEFINE_integer("shard_mb", 200, "Its shards' size.")
flags.DEFINE_integer("runs", 3, "Rounds; medians are quoted.")
flags.DEFINE_float("per_connection_mb_s", 30, "Each connection's cap, MB/s.")
flags.DEFINE_float("latency_ms", 30, "Added before each answer of the storage host, ms.")
flags.DEFINE_float("aggregate_mb_s", 150, "All connections together, MB/s.")
flags.DEFINE_integer("download_workers", 8, "snapshot_download's max_workers (its default).")
flags.DEFINE_string("work_dir", "/tmp/hf2maxtext-hub-benchmark", "Where the checkpoint, caches and outputs go.")
flags.DEFINE_string("results_page", "docs/hub-reads-results.md", "Markdown page each run is added to.")
flags.DEFINE_string("plot_dir", "docs/hub-reads", "Where each run's plot (PNG) goes.")

REPO = "bench-org/bench-moe"
RESULTS_PAGE = ResultsPage(
    "# Converting straight from the Hub: measured",
    "Written by `tools/hub_benchmark.py` (its docstring says what each run does); newest first. The goal "
    "(issue 60): a conversion from the Hub within 1.10x of the longer of huggingface_hub's own download and the "
    "conversion from local disk, each byte fetched once.",
    "<!-- runs below, newest first -->")
_DOWNLOAD = """
import sys, huggingface_hub
huggingface_hub.snapshot_download(sys.argv[1], allow_patterns=sys.argv[3:], max_workers=int(sys.argv[2]))
"""


class DiskSampler:
  """The bytes below some directories, sampled every 0.2 s on a thread while a run lasts."""

  def __init__(self, *directories: str):
    self._directories = directories
    self.trace: list[tuple[float, int]] = []
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._sample, daemon=True)

  def _sample(self) -> None:
    start = time.monotonic()
    while not self._stop.is_set():
      self.trace.append((time.monotonic() - start, sum(disk_use(d) for d in self._directories)))
      self._stop.wait(0.2)

  def __enter__(self) -> "DiskSampler":
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()

  @property
  def peak(self) -> int:
    return max((b for _, b in self.trace), default=0)


def disk_use(path: str) -> int:
  """The bytes the files below `path` occupy, a link counted as a link (the HF cache's snapshots link its blobs)."""
  total = 0
  for root, _, names in os.walk(path):
    for name in names:
      try:
        total += os.lstat(os.path.join(root, name)).st_blocks * 512
      except OSError:  # Renamed or removed while walking.
        pass
  return total


def _fresh(path: str) -> str:
  shutil.rmtree(path, ignore_errors=True)
  os.makedirs(path)
  return path


class Rounds:
  """The four runs of a round, each keeping what it measured."""

  def __init__(self, hub: hub_stand_in.HubStandIn, input_dir: str, needed: int):
    self.hub, self.input_dir, self.needed = hub, input_dir, needed
    self.figures: dict[str, list[dict]] = {}
    self.traces: dict[str, tuple[list, list]] = {}  # The runs from the Hub: RSS and local disk over time.
    self.env = child_env()
    self.env.update(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1")
    self.env.pop("HF_HUB_OFFLINE", None)

  def _keep(self, name: str, **figures) -> float:
    self.figures.setdefault(name, []).append(figures)
    return figures["wall"]

  def fresh_dirs(self) -> tuple[str, str, str]:
    return (_fresh(os.path.join(FLAGS.work_dir, "cache")), _fresh(os.path.join(FLAGS.work_dir, "tmp")),
            os.path.join(_fresh(os.path.join(FLAGS.work_dir, "out")), "ckpt"))

  def download(self) -> float:
    cache, tmp, _ = self.fresh_dirs()
    sent = self.hub.bytes_sent
    names = sorted(n for n in os.listdir(self.input_dir) if n.endswith((".json", ".safetensors")))
    with DiskSampler(cache, tmp) as disk:
      measured = measure("snapshot_download", [PYTHON, "-c", _DOWNLOAD, REPO, str(FLAGS.download_workers), *names],
                         env=dict(self.env, HF_HUB_CACHE=cache, TMPDIR=tmp))
    return self._keep("download", wall=measured.wall, cpu=measured.cpu, peak=measured.peak, disk=disk.peak,
                      fetched=self.hub.bytes_sent - sent)

  def local(self) -> float:
    cache, tmp, out = self.fresh_dirs()
    with DiskSampler(cache, tmp) as disk:
      measured = measure("local conversion", [*CONVERTER, f"--hf_model_path={self.input_dir}",
                                              f"--output_dir={out}", "--noprogress"],
                         env=dict(self.env, HF_HUB_CACHE=cache, TMPDIR=tmp))
    return self._keep("local", wall=measured.wall, cpu=measured.cpu, peak=measured.peak, disk=disk.peak, fetched=0)

  def _from_hub(self, name: str, *flags_given: str) -> float:
    cache, tmp, out = self.fresh_dirs()
    sent, requests = self.hub.bytes_sent, len(self.hub.ranges)
    rss: list[tuple[float, int]] = []
    with DiskSampler(cache, tmp) as disk:
      measured = measure(name, [*CONVERTER, f"--hf_model_path={REPO}", f"--output_dir={out}", "--noprogress",
                                *flags_given], env=dict(self.env, HF_HUB_CACHE=cache, TMPDIR=tmp), trace=rss)
    self.traces[name] = (rss, disk.trace)
    return self._keep(name, wall=measured.wall, cpu=measured.cpu, peak=measured.peak, disk=disk.peak,
                      fetched=self.hub.bytes_sent - sent, requests=len(self.hub.ranges) - requests)

  def hub_ranged(self) -> float:
    return self._from_hub("hub")

  def download_first(self) -> float:
    return self._from_hub("download first", "--hub_download_first")


def _mib_or_kib(nbytes: float) -> str:
  return f"{nbytes / 2**20:,.0f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:,.0f} KiB"


def summary_rows(figures: dict[str, list[dict]], needed: int) -> tuple[tuple[str, ...], ...]:
  """Each run's medians: the hub run against the longer floor, the download-first run against their sum."""
  median = lambda name, key: statistics.median(f[key] for f in figures[name])
  walls = {name: median(name, "wall") for name in figures}
  floor = max(walls["download"], walls["local"])
  rows = []
  for name in ("download", "local", "hub", "download first"):
    fetched = median(name, "fetched")
    against = (f"{walls[name] / floor:.2f}x the longer floor" if name == "hub" else
               f"{walls[name] / (walls['download'] + walls['local']):.2f}x the floors' sum" if name == "download first"
               else "floor")
    rows.append((name, f"{walls[name]:.1f} s", against, f"{median(name, 'cpu'):.1f}",
                 f"{median(name, 'peak') / 2**20:.0f} MiB", _mib_or_kib(median(name, 'disk')),
                 f"{fetched / 1e9:.2f} GB ({fetched / needed:.3f}x)" if fetched else "-",
                 f"{median(name, 'requests'):,.0f}" if "requests" in figures[name][0] else "-"))
  return tuple(rows)


def draw(traces: dict, path: str, title: str) -> None:
  """RSS and local disk over time of the runs from the Hub, as a PNG."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top

  figure, (rss_axes, disk_axes) = pyplot.subplots(1, 2, figsize=(11, 4), dpi=100)
  for (name, (rss, disk)), color in zip(sorted(traces.items()), ("tab:blue", "tab:orange")):
    rss_axes.plot([t for t, _ in rss], [b / 2**20 for _, b in rss], color=color, linewidth=0.8, label=name)
    disk_axes.plot([t for t, _ in disk], [b / 2**20 for _, b in disk], color=color, linewidth=0.8, label=name)
  rss_axes.set_title("RSS of the converter's process tree", fontsize=10)
  disk_axes.set_title("local disk: HF cache + TMPDIR", fontsize=10)
  for axes in (rss_axes, disk_axes):
    axes.set_xlabel("seconds")
    axes.set_ylabel("MiB")
    axes.set_ylim(bottom=0)
    axes.legend(fontsize=8)
  figure.suptitle(title, fontsize=10)
  figure.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  figure.savefig(path)
  pyplot.close(figure)


def main(argv: Sequence[str]) -> None:
  del argv
  started = datetime.datetime.now(datetime.timezone.utc)
  input_dir = os.path.join(FLAGS.work_dir, f"input-{FLAGS.size_gb:g}gb-{FLAGS.shard_mb}mb")
  if not os.path.exists(os.path.join(input_dir, "config.json")):
    shutil.rmtree(input_dir, ignore_errors=True)
    synthetic_checkpoint.write_family_checkpoint(input_dir, "qwen3_moe", int(FLAGS.size_gb * 1e9),
                                                 max_shard_bytes=FLAGS.shard_mb << 20)
  needed = sum(os.path.getsize(os.path.join(input_dir, n)) for n in os.listdir(input_dir)
               if n.endswith(".safetensors"))
  link = hub_stand_in.LinkLimits(per_connection_bytes_per_s=FLAGS.per_connection_mb_s * 1e6,
                                 latency_s=FLAGS.latency_ms / 1e3, aggregate_bytes_per_s=FLAGS.aggregate_mb_s * 1e6)
  with hub_stand_in.HubStandIn({REPO: input_dir}, link=link, root_parent=FLAGS.work_dir) as hub:
    rounds = Rounds(hub, input_dir, needed)
    cache, tmp, out = rounds.fresh_dirs()
    predicted, = dry_run([*CONVERTER, f"--hf_model_path={REPO}", f"--output_dir={out}"],
                         dict(rounds.env, HF_HUB_CACHE=cache, TMPDIR=tmp), "predicted peak RSS")
    alternating([("download", rounds.download), ("local", rounds.local), ("hub", rounds.hub_ranged),
                 ("download first", rounds.download_first)], FLAGS.runs,
                after_round=lambda i, s: print(f"round {i + 1}: " + ", ".join(f"{n} {v[-1]:.1f} s"
                                                                             for n, v in s.items()), flush=True))
  shutil.rmtree(FLAGS.work_dir + "/out", ignore_errors=True)
  rows = summary_rows(rounds.figures, needed)
  stamp = started.strftime("%Y%m%d-%H%M")
  plot = workspace_path(os.path.join(FLAGS.plot_dir, f"{stamp}.png"))
  draw(rounds.traces, plot, f"{needed / 1e9:.2f} GB from the Hub stand-in, last round")
  table = ResultTable(
      f"{needed / 1e9:.2f} GB of bfloat16 weights in {FLAGS.shard_mb} MB shards; link: {FLAGS.per_connection_mb_s:g}"
      f" MB/s a connection, {FLAGS.latency_ms:g} ms a request, {FLAGS.aggregate_mb_s:g} MB/s in all; medians of"
      f" {FLAGS.runs}; fetched: the storage host's bytes (over the weights' bytes); requests: ranged GETs; the hub"
      f" run's --dry_run predicted a peak RSS of {predicted / 2**20:.0f} MiB",
      ("run", "wall", "against", "CPU-s", "peak RSS", "peak local disk", "fetched", "requests"), rows)
  print_table(table)
  rel = os.path.relpath(plot, os.path.dirname(workspace_path(FLAGS.results_page)))
  section = render_run_section([table], started, machine_description(),
                               command_line(sys.argv, "//tools:hub_benchmark"),
                               notes=[f"plot: [RSS and local disk over time]({rel})"])
  print(f"added to {RESULTS_PAGE.write(FLAGS.results_page, section)}", flush=True)


if __name__ == "__main__":
  app.run(main)
