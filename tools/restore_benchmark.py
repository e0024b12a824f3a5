"""What a pod pays to restore our checkpoints: bytes read through MaxText's own loader, by layout.

  bazel run //tools:restore_benchmark -- --maxtext_python=$PWD/.mtvenv/bin/python \
      --results_page=$PWD/docs/restore-results.md
  # or, without Bazel: PYTHONPATH=. .venv/bin/python tools/restore_benchmark.py --results_page=docs/restore-results.md

For a dense (Llama-shaped) and an MoE (Qwen3-MoE-shaped) synthetic bf16 checkpoint, converted four ways (the
default layout; `--target_mesh`; the write blocks as the only chunks, i.e. the layout before chunks were cut for
the restoring mesh; and MaxText 0.2.5's own converter, `to_maxtext`, on the same safetensors), MaxText 0.2.5 restores
each with `from_pretrained` in --processes CPU processes of --devices_per_process devices joined by
jax.distributed on 127.0.0.1 (integration_tests/maxtext_interop/restore_reads.py). Read amplification = the sum
of every process's /proc/self/io rchar during the restore / the bytes stored (so it includes the few MiB each
process reads of metadata). Beside it: the prediction from metadata alone at the measured mesh and at fsdp 64 and
256 (hosts of 4 devices), and the conversion's wall time, peak RSS and stored bytes (median of --runs).

Two more rows say what laying MaxText's output out again buys (docs/relayout.md): MaxText's `to_maxtext` output
restored as it is on --target_mesh, and the same checkpoint laid out again by ours for that mesh (MaxText ->
MaxText, `--checkpoint_path --target_mesh`, its config from the safetensors' config.json) restored there.
`--layouts` picks rows. With `safetensors_dynamic` among them, a section on a training job's start follows: our
default layout and, with no conversion at all, the HuggingFace files themselves, each loaded as MaxText 0.2.5's
training start loads `load_parameters_path` (the files through `source_checkpoint_layout=safetensors_dynamic`,
transformed on the devices, their HuggingFace config from their config.json: restore_reads.py --loader=training).

Then, for the layouts restored on fsdp over every device (a `--target_mesh` naming that mesh included), stock
Orbax v1 restores each as MaxText's loader calls it (tools/sharded_restore.py) beside the same checkpoint
pre-sharded for that mesh: from the local disk (--local_rounds alternating rounds, files warm in the page cache)
and from the GCS emulator with --bucket_latency_ms added to every request (as many rounds), counting each
process's requests.

MaxText's row: integration_tests/maxtext_interop/maxtext_convert.py runs `to_maxtext` under --maxtext_python with
its defaults (`--lazy_load_tensors=True --simulated_cpu_devices_count=16`, bf16, scan_layers) and, as MaxText
config arguments, the model name and the overrides our conversion recorded for the same weights (two shims, for
local weights without torch: see that file). Its convert s and peak RSS are that process's, imports included, as
ours are; after each conversion its stored tree (leaf paths, shapes, dtypes) must equal our default layout's, or
the benchmark stops. Its prediction comes from converter.layout.layout_inspection, which takes a checkpoint without our
record's logical axes (MaxText's own) from the leaf paths.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import statistics
import subprocess
import sys
from typing import Callable

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from converter.storage import scratch  # pylint: disable=g-import-not-at-top,wrong-import-position
from tools import benchmark_runner  # pylint: disable=g-import-not-at-top,wrong-import-position
from tools.process_sampling import run_sampled  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS
flags.DEFINE_string("maxtext_python", os.path.join(ROOT, ".mtvenv", "bin", "python"), "Python with maxtext==0.2.5.")
flags.DEFINE_integer("processes", 4, "Simulated hosts.")
flags.DEFINE_integer("devices_per_process", 4, "Devices per simulated host.")
flags.DEFINE_string("target_mesh", "fsdp=8,tensor=2", "The --target_mesh layout's mesh (processes x devices).")
flags.DEFINE_integer("runs", 3, "Conversions per layout for the wall time and peak RSS medians.")
flags.DEFINE_list("shapes", ["dense", "moe"], "Which synthetic checkpoints.")
flags.DEFINE_string("work_dir", None, "Where checkpoints go (default: a temporary directory, removed).")
flags.DEFINE_string("results_page", None, "Write the table to this Markdown page as well.")
flags.DEFINE_list("layouts", ["default", "target_mesh", "write", "to_maxtext", "to_maxtext_target_mesh", "relayout",
                              "safetensors_dynamic"],
                  "Which rows (the first, `default`, is always converted: the others are checked against it):"
                  " default, target_mesh, write, to_maxtext, to_maxtext_target_mesh (MaxText's output restored on"
                  " --target_mesh), relayout (MaxText's output laid out again by ours, --checkpoint_path"
                  " --target_mesh; needs to_maxtext), safetensors_dynamic (no conversion: MaxText 0.2.5 loading the"
                  " HuggingFace files and transforming them on the devices, as it can at every start).")
flags.DEFINE_integer("local_rounds", 3, "Rounds of the local-disk rows beside the pre-sharded checkpoint (0: none),"
                     " and of the bucket rows (at least one).")
flags.DEFINE_float("bucket_latency_ms", 30.0, "The bucket rows' latency added to every request (negative: no"
                   " bucket rows).")

RESTORE = os.path.join(ROOT, "integration_tests", "maxtext_interop", "restore_reads.py")
SHARDED_RESTORE = os.path.join(ROOT, "tools", "sharded_restore.py")
MAXTEXT_CONVERT = os.path.join(ROOT, "integration_tests", "maxtext_interop", "maxtext_convert.py")


def _shapes() -> dict:
  from tools import synthetic_checkpoint as synthetic  # pylint: disable=g-import-not-at-top

  return {
      # Llama-shaped, about 1 GB: 8 layers of hidden 2048, MLP 6144, GQA 16:8.
      "dense": ("llama3.1-8b", synthetic.llama_config(hidden=2048, layers=8, intermediate=6144, heads=16, kv_heads=8,
                                                      vocab=32768), synthetic.llama_shapes),
      # Qwen3-MoE-shaped, about 0.9 GB: 4 layers of 32 experts of 768 at hidden 1536.
      "moe": ("qwen3-30b-a3b", synthetic.qwen3_moe_config(hidden=1536, layers=4, experts=32, moe_dim=768, heads=16,
                                                         kv_heads=4, head_dim=96, vocab=32768),
              synthetic.qwen3_moe_shapes),
  }


def _convert(hf_dir: str, out: str, model: str, ours: str, layout_flags: list[str]) -> dict:
  """The converter binary, timed as a process (wall, peak RSS of its process tree)."""
  del model, ours
  seconds, peak, result = run_sampled(
      [sys.executable, os.path.join(ROOT, "converter", "main.py"), f"--hf_model_path={hf_dir}",
       f"--output_dir={out}", "--overwrite", "--noprogress", *layout_flags], dict(os.environ, PYTHONPATH=ROOT))
  if result.returncode:
    raise RuntimeError(f"converting {hf_dir} with {layout_flags} failed (exit {result.returncode}):\n"
                       f"{result.stderr[-3000:]}")
  return {"seconds": seconds, "peak_mib": peak / 2**20}


def _maxtext_env() -> dict:
  return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _tail(path: str) -> str:
  with open(path, encoding="utf-8", errors="replace") as f:
    return "".join(f.readlines()[-15:])


def _convert_maxtext(hf_dir: str, out: str, model: str, ours: str) -> dict:
  """MaxText's own `to_maxtext` on the same weights (maxtext_convert.py under --maxtext_python), timed as a
  process like `_convert`, with the overrides our conversion to `ours` recorded; then, untimed, its stored tree
  checked against `ours` (leaf paths, shapes, dtypes): a difference stops the benchmark."""
  from converter.checkpoint_format.record import ConversionRecord  # pylint: disable=g-import-not-at-top

  overrides = os.path.join(os.path.dirname(out), "to_maxtext_overrides.json")
  with open(overrides, "w", encoding="utf-8") as f:
    json.dump(ConversionRecord.read(ours).maxtext_overrides, f)
  log = os.path.join(os.path.dirname(out), "to_maxtext.log")
  seconds, peak, result = run_sampled(
      [FLAGS.maxtext_python, MAXTEXT_CONVERT, f"--hf_model_path={hf_dir}", f"--model_name={model}",
       f"--overrides=@{overrides}", f"--output_dir={out}", "--overwrite"], _maxtext_env())
  with open(log, "w", encoding="utf-8") as f:
    f.write(result.stdout + result.stderr)
  if result.returncode:
    raise RuntimeError(f"MaxText's to_maxtext on {hf_dir} failed (exit {result.returncode}), {log}:\n{_tail(log)}")
  check = subprocess.run([FLAGS.maxtext_python, MAXTEXT_CONVERT, "--noconvert", f"--output_dir={out}",
                          f"--compare_with={ours}"], capture_output=True, text=True, env=_maxtext_env(), check=False)
  if check.returncode:
    mismatches = [line for line in check.stdout.splitlines() if line.startswith("TREE MISMATCH")]
    raise RuntimeError(f"MaxText's to_maxtext output {out} is not the tree of {ours} (exit {check.returncode}):\n"
                       + "\n".join(mismatches or check.stderr.splitlines()[-15:]))
  return {"seconds": seconds, "peak_mib": peak / 2**20}


def _relayout(hf_dir: str, out: str, model: str, ours: str) -> dict:
  """MaxText's own output (the `to_maxtext` row's) laid out again by ours for --target_mesh (MaxText -> MaxText:
  --checkpoint_path; MaxText records no config, so --hf_config_path gives it), timed as a process like `_convert`."""
  del model, ours
  source = os.path.join(os.path.dirname(out), "to_maxtext", "0", "items")
  seconds, peak, result = run_sampled(
      [sys.executable, os.path.join(ROOT, "converter", "main.py"), "--direction=to_maxtext",
       f"--checkpoint_path={source}", f"--hf_config_path={hf_dir}", f"--output_dir={out}", "--overwrite",
       "--noprogress", f"--target_mesh={FLAGS.target_mesh}"], dict(os.environ, PYTHONPATH=ROOT))
  if result.returncode:
    raise RuntimeError(f"laying {source} out again failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
  return {"seconds": seconds, "peak_mib": peak / 2**20}


def _stored_bytes(items: str) -> int:
  step = os.path.dirname(items)
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(step) for f in fs)


def _restore(items: str, model: str, mesh: str, ours: str, source_layout: str = "orbax",
             loader: str = "from_pretrained") -> tuple[int, float]:
  """(bytes all processes read, slowest process's seconds) of MaxText restoring `items` on `mesh`, with the
  overrides recorded in `items` (our layouts) or else in `ours` (MaxText's own output records none, nor do the
  HuggingFace files MaxText loads itself with `source_layout="safetensors_dynamic"`)."""
  from converter.checkpoint_format.record import ConversionRecord  # pylint: disable=g-import-not-at-top

  overrides = os.path.join(os.path.dirname(items), "overrides.json")
  recorded = ConversionRecord.read(items).maxtext_overrides if source_layout == "orbax" else None
  with open(overrides, "w", encoding="utf-8") as f:
    json.dump(recorded or ConversionRecord.read(ours).maxtext_overrides, f)
  results = _process_group(
      f"MaxText restore of {items} on {mesh}",
      lambda i: [FLAGS.maxtext_python, RESTORE, f"--checkpoint={items}", f"--model_name={model}",
                 f"--overrides=@{overrides}", f"--mesh={mesh}", f"--source_layout={source_layout}",
                 f"--loader={loader}"],
      lambda i: _maxtext_env())
  return sum(r["rchar"] for r in results), max(r["seconds"] for r in results)


def _process_group(what: str, command: Callable[[int], list[str]], env: Callable[[int], dict]) -> list[dict]:
  """--processes processes joined by jax.distributed on 127.0.0.1 (process i runs `command(i)` plus the flags
  that join it, in `env(i)`); the JSON result line each printed."""
  from tools.ports import free_port  # pylint: disable=g-import-not-at-top

  address = f"127.0.0.1:{free_port()}"
  children = [subprocess.Popen(
      [*command(i), f"--process_id={i}", f"--num_processes={FLAGS.processes}",
       f"--devices_per_process={FLAGS.devices_per_process}", f"--coordinator={address}"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(i)) for i in range(FLAGS.processes)]
  results = []
  for child in children:
    out, err = child.communicate(timeout=900)
    if child.returncode:
      raise RuntimeError(f"{what} failed (exit {child.returncode}):\n{err[-3000:]}")
    # The JSON line, read up to its end: something else on the same stdout (the runtime's own logging) can end
    # up on that line (seen once: "Extra data" after the object).
    starts = [line[line.index('{"process"'):] for line in out.splitlines() if '{"process"' in line]
    if not starts:
      raise RuntimeError(f"{what} printed no result:\n{out[-2000:]}")
    results.append(json.JSONDecoder().raw_decode(starts[-1])[0])
  return results


def _sharded_restore(items: str, logical_axes_from: str, env: dict, proxies: list | None = None,
                     save_to: str | None = None) -> float:
  """Stock Orbax v1 restoring `items` as MaxText's loader does, in --processes processes (tools/sharded_restore.py),
  process i's bucket requests through `proxies[i]`; the slowest process's seconds."""
  def child_env(i: int) -> dict:
    through_proxy = {"TENSORSTORE_GCS_HTTP_URL": proxies[i].url} if proxies else {}
    return dict(env, PYTHONPATH=ROOT, **through_proxy)

  results = _process_group(
      f"restoring {items}",
      lambda i: [sys.executable, SHARDED_RESTORE, f"--checkpoint={items}", f"--logical_axes_from={logical_axes_from}",
                 *([f"--save_to={save_to}"] if save_to else [])],
      child_env)
  return max(r["seconds"] for r in results)


PRE_SHARDED = "pre-sharded (Orbax from the mesh)"


def _with_pre_sharded(layouts: list[tuple[str, str]], ours: str) -> list[tuple[str, str]]:
  """`layouts` (name, items) after the same checkpoint pre-sharded for the restoring mesh: stock Orbax saving what
  it restored of `ours` from that mesh (MaxText's `reshard_checkpoint`), saved once per shape."""
  from tools import checkpoint_io  # pylint: disable=g-import-not-at-top

  pre_sharded = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(ours))), "pre_sharded", "0")
  if not os.path.exists(pre_sharded):
    _sharded_restore(ours, ours, dict(os.environ), save_to=pre_sharded)
  return [(PRE_SHARDED, checkpoint_io.saved_items(pre_sharded)), *layouts]


def _local_rows(shape: str, layouts: list[tuple[str, str]], ours: str) -> list[str]:
  """Each layout restored from the local disk as the bucket rows restore it (stock Orbax v1 in --processes
  processes), --local_rounds rounds in alternating order, its files read into the page cache first: the median
  of the slowest process's seconds, beside the pre-sharded checkpoint's."""
  from tools import floors  # pylint: disable=g-import-not-at-top

  def restore(items: str) -> float:
    floors.warm(items)
    return _sharded_restore(items, ours, dict(os.environ))

  layouts = _with_pre_sharded(layouts, ours)
  runs = [(name, functools.partial(restore, items)) for name, items in layouts]
  return _median_rows(shape, benchmark_runner.alternating(runs, FLAGS.local_rounds))


def _training_start_rows(shape: str, hf_dir: str, model: str, mesh: str, ours: str) -> list[str]:
  """Our default layout and the HuggingFace files it came from, each loaded as a MaxText 0.2.5 training job
  starts (`load_parameters_path`; the files with `source_checkpoint_layout=safetensors_dynamic`) on `mesh`,
  --local_rounds rounds in alternating order, files warm in the page cache: the median of the slowest process's
  seconds, and the ratio to ours."""
  from tools import floors  # pylint: disable=g-import-not-at-top

  def start(path: str, layout: str) -> float:
    floors.warm(path if layout == "safetensors_dynamic" else os.path.dirname(path))
    return _restore(path, model, mesh, ours, source_layout=layout, loader="training")[1]

  return _median_rows(shape, benchmark_runner.alternating([
      ("default (ours)", functools.partial(start, ours, "orbax")),
      ("MaxText `safetensors_dynamic` (the HuggingFace files, no conversion)",
       functools.partial(start, hf_dir, "safetensors_dynamic"))], max(1, FLAGS.local_rounds)))


def _median_rows(shape: str, seconds: dict[str, list[float]]) -> list[str]:
  """A row per name: the median, every run, and the ratio to the first name's median."""
  reference = statistics.median(next(iter(seconds.values())))
  rows = []
  for name, runs in seconds.items():
    median = statistics.median(runs)
    rows.append(f"| {shape} | {name} | {median:.2f} | {', '.join(f'{s:.2f}' for s in runs)} |"
                f" {median / reference:.2f}x |")
    print(rows[-1], flush=True)
  return rows


def _bucket_rows(shape: str, layouts: list[tuple[str, str]], ours: str) -> list[str]:
  """Each layout restored from the GCS emulator by --processes processes, each through its own counting proxy
  that holds every request --bucket_latency_ms, --local_rounds rounds in alternating order: the busiest process's
  requests, all bytes the processes fetched over the bytes stored (both from the first round: they do not vary),
  and the median of the slowest process's seconds, beside the same checkpoint pre-sharded for the mesh
  (`_with_pre_sharded`)."""
  from tools.gcs_emulator import GcsEmulator  # pylint: disable=g-import-not-at-top
  from tools.request_proxy import RequestProxy  # pylint: disable=g-import-not-at-top

  work = os.path.dirname(os.path.dirname(ours))
  layouts = _with_pre_sharded(layouts, ours)
  counts: dict[str, tuple[int, int]] = {}
  with GcsEmulator(root=os.path.join(os.path.dirname(work), "gcs")) as gcs:
    gcs.create_bucket("restore-bench")
    uploaded = {}
    for name, items in layouts:
      step = os.path.dirname(items)
      prefix = f"{shape}/{os.path.basename(os.path.dirname(step))}"
      gcs.upload_dir(step, "restore-bench", f"{prefix}/0")
      uploaded[name] = f"gs://restore-bench/{prefix}/0/{os.path.basename(items)}"

    def restore(name: str) -> float:
      proxies = [RequestProxy(gcs.url, FLAGS.bucket_latency_ms / 1000).start() for _ in range(FLAGS.processes)]
      try:
        seconds = _sharded_restore(uploaded[name], ours, dict(os.environ, **gcs.env), proxies)
      finally:
        for proxy in proxies:
          proxy.stop()
      counts.setdefault(name, (max(proxy.counts.gets for proxy in proxies),
                               sum(proxy.counts.get_bytes for proxy in proxies)))
      return seconds

    seconds = benchmark_runner.alternating([(name, functools.partial(restore, name)) for name, _ in layouts],
                                           max(1, FLAGS.local_rounds))
  rows = []
  reference_gets, reference_seconds = counts[layouts[0][0]][0], statistics.median(seconds[layouts[0][0]])
  for number, (name, items) in enumerate(layouts):
    busiest, fetched = counts[name]
    median = statistics.median(seconds[name])
    if number:
      predicted = " / ".join(f"{n:,}" for n in _predicted_bucket_requests(
          items, [f"fsdp={FLAGS.processes * FLAGS.devices_per_process}", "fsdp=64", "fsdp=256"]))
    else:
      predicted = f"{_leaf_count(items)} (one per leaf)"
    rows.append(f"| {shape} | {name} | {busiest:,} ({busiest / reference_gets:.1f}x) | {predicted} |"
                f" {fetched / _stored_bytes(items):.2f}x | {median:.2f} ({median / reference_seconds:.2f}x) |"
                f" {', '.join(f'{s:.2f}' for s in seconds[name])} |")
    print(rows[-1], flush=True)
  return rows


def _leaf_count(items: str) -> int:
  from converter.layout import layout_inspection  # pylint: disable=g-import-not-at-top

  return len(layout_inspection.stored_leaves(items)[0])


def _predicted_bucket_requests(items: str, meshes: list[str]) -> list[int]:
  from converter.layout import chunking, layout_inspection  # pylint: disable=g-import-not-at-top

  leaves = list(layout_inspection.stored_leaves(items)[0].values())
  return [chunking.predicted_bucket_requests(leaves, chunking.parse_mesh(m)) for m in meshes]


def _predicted(items: str, meshes: list[str]) -> list[str]:
  from converter.layout import chunking, layout_inspection  # pylint: disable=g-import-not-at-top

  leaves = list(layout_inspection.stored_leaves(items)[0].values())
  return [f"{chunking.predicted_amplification(leaves, chunking.parse_mesh(m))[0]:.2f}" for m in meshes]


def benchmark(work: str) -> None:
  from converter.layout import chunking  # pylint: disable=g-import-not-at-top
  from tools import synthetic_checkpoint  # pylint: disable=g-import-not-at-top

  devices = FLAGS.processes * FLAGS.devices_per_process
  fsdp = f"fsdp={devices}"
  # (row name, output directory, restore mesh, convert(hf_dir, out, model, ours)); the first is `ours`, the
  # layout MaxText's own output is checked against and whose recorded overrides it is converted with.
  layouts = [
      ("default", "default", fsdp, functools.partial(_convert, layout_flags=[])),
      (f"--target_mesh={FLAGS.target_mesh}", "target_mesh", FLAGS.target_mesh,
       functools.partial(_convert, layout_flags=[f"--target_mesh={FLAGS.target_mesh}"])),
      ("write blocks (before)", "write", fsdp, functools.partial(_convert, layout_flags=["--nochunk_layout"])),
      ("MaxText `to_maxtext`", "to_maxtext", fsdp, _convert_maxtext),
      # MaxText's output as it is, on the mesh the next row lays it out for (no conversion of its own).
      ("MaxText `to_maxtext`, on the target mesh", "to_maxtext", FLAGS.target_mesh, None),
      (f"MaxText `to_maxtext` laid out again by ours (--checkpoint_path --target_mesh={FLAGS.target_mesh})",
       "relayout", FLAGS.target_mesh, _relayout),
  ]
  keys = ("default", "target_mesh", "write", "to_maxtext", "to_maxtext_target_mesh", "relayout")
  layouts = [layout for key, layout in zip(keys, layouts) if key == "default" or key in FLAGS.layouts]
  rows, local_rows, bucket_rows, start_rows = [], [], [], []
  header = (f"| shape | layout | restore mesh ({FLAGS.processes} x {FLAGS.devices_per_process}) | read / stored"
            f" (measured) | predicted | restore s | predicted at fsdp=64 / 256 | stored MB | convert s (median) |"
            f" peak RSS MiB |")
  print(header, flush=True)
  for shape in FLAGS.shapes:
    model, config, shapes = _shapes()[shape]
    hf_dir = os.path.join(work, shape, "hf")
    if not os.path.exists(os.path.join(hf_dir, "config.json")):
      synthetic_checkpoint.write_checkpoint(hf_dir, config, list(shapes(config)))
    ours = os.path.join(work, shape, layouts[0][1], "0", "items")
    for name, directory, mesh, convert in layouts:
      out = os.path.join(work, shape, directory)
      runs = [convert(hf_dir, out, model, ours) for _ in range(FLAGS.runs)] if convert else []
      items = os.path.join(out, "0", "items")
      read, seconds = _restore(items, model, mesh, ours)
      stored = _stored_bytes(items)
      predicted, at_64, at_256 = _predicted(items, [mesh, "fsdp=64", "fsdp=256"])
      convert_s = f"{statistics.median(r['seconds'] for r in runs):.1f}" if runs else ""
      peak_mib = f"{statistics.median(r['peak_mib'] for r in runs):.0f}" if runs else ""
      row = (f"| {shape} | {name} | {mesh} | {read / stored:.2f}x | {predicted}x | {seconds:.1f} | {at_64}x / {at_256}x"
             f" | {stored / 1e6:.1f} | {convert_s} | {peak_mib} |")
      rows.append(row)
      print(row, flush=True)
    if "safetensors_dynamic" in FLAGS.layouts:
      start_rows += _training_start_rows(shape, hf_dir, model, fsdp, ours)
    # Stock Orbax restores on fsdp over every device: a --target_mesh layout joins only when that is its mesh.
    sharded = [(name, os.path.join(work, shape, directory, "0", "items")) for name, directory, mesh, convert in layouts
               if convert and directory != "relayout" and chunking.parse_mesh(mesh) == chunking.parse_mesh(fsdp)]
    if FLAGS.local_rounds:
      local_rows += _local_rows(shape, sharded, ours)
    if FLAGS.bucket_latency_ms >= 0:
      bucket_rows += _bucket_rows(shape, sharded, ours)
  if FLAGS.results_page:
    with open(FLAGS.results_page, "w", encoding="utf-8") as f:
      f.write("# Restore read amplification (tools/restore_benchmark.py)\n\n"
              f"Written by `tools/restore_benchmark.py` on {datetime.date.today()}: MaxText 0.2.5's `from_pretrained`"
              f" restoring each checkpoint in {FLAGS.processes} processes of {FLAGS.devices_per_process} CPU devices"
              " joined by jax.distributed on 127.0.0.1. \"read / stored\": the sum of each process's /proc/self/io"
              " rchar during the restore over the bytes stored (metadata reads included); \"predicted\": from the"
              " stored chunk grid alone (hosts of 4 devices, each reading every chunk its devices touch once)."
              " Each read, predicted and restore figure is one restore of the last conversion."
              f" Conversion time and peak RSS: medians of {FLAGS.runs} runs on this machine (each a whole"
              " process, imports included). \"MaxText `to_maxtext`\": MaxText 0.2.5's own converter on the same"
              " safetensors with its defaults (16 simulated devices, lazy loading, bf16, scanned), the model name"
              " and the overrides our conversion recorded, run by integration_tests/maxtext_interop/"
              "maxtext_convert.py (local config and a bf16 numpy reader shimmed in, as it runs without torch); its"
              " stored tree is checked equal to our default layout's.\n\n")
      f.write(header + "\n|" + "---|" * 10 + "\n" + "\n".join(rows) + "\n")
      for title, text, rows_of_section in (
          ("A training job's start: converted, or the HuggingFace files at every start",
           "Our default layout and the safetensors it came from, each loaded as a MaxText 0.2.5 training job"
           " starts (`checkpointing.load_state_if_possible` from `load_parameters_path`, the train state built"
           " first; the safetensors with `source_checkpoint_layout=safetensors_dynamic`, loaded and transformed"
           f" on the devices, its HuggingFace config taken from their config.json) on fsdp={devices},"
           f" {max(1, FLAGS.local_rounds)} rounds in alternating order, files warm in the page cache. Ratios are"
           " to ours.", start_rows),
          ("From the local disk, beside the pre-sharded checkpoint",
           f"The layouts restored on fsdp={devices} as the bucket rows below restore them (stock Orbax v1 `load`,"
           " tools/sharded_restore.py), from this machine's disk with the files first read into the page"
           f" cache, {FLAGS.local_rounds} rounds in alternating order; \"pre-sharded\" as below, the ratios to it.",
           local_rows)):
        if rows_of_section:
          f.write(f"\n## {title}\n\n{text} Seconds: the slowest process's.\n\n"
                  "| shape | what | seconds (median) | runs | ratio |\n|---|---|---|---|---|\n"
                  + "\n".join(rows_of_section) + "\n")
      if bucket_rows:
        f.write(f"\n## From a bucket, {FLAGS.bucket_latency_ms:.0f} ms per request\n\n"
                "The same checkpoints in the GCS emulator (fake-gcs-server on 127.0.0.1), restored on"
                f" fsdp={devices} by stock Orbax v1 `load` as MaxText's loader calls it (tools/sharded_restore.py:"
                " every leaf a jax.Array sharded by its logical axes), each process's requests through its own"
                " proxy (tools/request_proxy.py) that counts them and holds each one"
                f" {FLAGS.bucket_latency_ms:.0f} ms. Orbax turns on tensorstore's read coalescing for buckets"
                " (reads of one object issued within 1 ms and at most 1 MB apart become one request), so these"
                " counts, not a local restore's read calls, are what a bucket bills and waits for. \"pre-sharded\":"
                " what stock Orbax saves from that mesh (one chunk per device shard, every process's shards in its"
                " own files: MaxText's `reshard_checkpoint`). Ratios are to that row. Seconds: the slowest"
                f" process's, {max(1, FLAGS.local_rounds)} rounds in alternating order (the median, and every"
                " run); requests and bytes: the first round's.\n\n"
                " \"predicted\": the busiest host's requests from the stored grids alone"
                " (converter/chunking.bucket_requests: two per stored block it touches, one for a block read whole)"
                f" at fsdp={devices}, 64 and 256; a pre-sharded checkpoint is predicted one per leaf.\n\n"
                "| shape | layout | GET requests of the busiest process | predicted (fsdp 16 / 64 / 256) |"
                " fetched / stored | restore s (median) | runs |\n"
                "|---|---|---|---|---|---|---|\n" + "\n".join(bucket_rows) + "\n")


def main(argv: list[str]) -> None:
  del argv
  if FLAGS.work_dir:
    benchmark(FLAGS.work_dir)
  else:
    with scratch.directory("restore-benchmark") as work:
      benchmark(work)


if __name__ == "__main__":
  app.run(main)
