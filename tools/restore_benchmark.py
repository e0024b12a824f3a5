"""What a pod pays to restore our checkpoints: bytes read through MaxText's own loader, by layout.

  bazel run //tools:restore_benchmark -- --maxtext_python=$PWD/.mtvenv/bin/python \
      --results_page=$PWD/docs/restore-results.md

For a dense (Llama-shaped) and an MoE (Qwen3-MoE-shaped) synthetic bf16 checkpoint, converted three ways (the
default layout, `--target_mesh`, and the write blocks as the only chunks, the layout before chunks were cut for the
restoring mesh), MaxText 0.2.5 restores each with `from_pretrained` in --processes CPU processes of
--devices_per_process devices joined by jax.distributed on 127.0.0.1 (integration_tests/maxtext_interop/
restore_reads.py). Read amplification = the sum of every process's /proc/self/io rchar during the restore / the
bytes stored (so it includes the few MiB each process reads of metadata). Beside it: the prediction from metadata
alone at the measured mesh and at fsdp 64 and 256 (hosts of 4 devices), and the conversion's wall time, peak RSS
and stored bytes (median of --runs) for the default layout against the write-block layout.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

FLAGS = flags.FLAGS
flags.DEFINE_string("maxtext_python", os.path.join(ROOT, ".mtvenv", "bin", "python"), "Python with maxtext==0.2.5.")
flags.DEFINE_integer("processes", 4, "Simulated hosts.")
flags.DEFINE_integer("devices_per_process", 4, "Devices per simulated host.")
flags.DEFINE_string("target_mesh", "fsdp=8,tensor=2", "The --target_mesh layout's mesh (processes x devices).")
flags.DEFINE_integer("runs", 3, "Conversions per layout for the wall time and peak RSS medians.")
flags.DEFINE_list("shapes", ["dense", "moe"], "Which synthetic checkpoints.")
flags.DEFINE_string("work_dir", None, "Where checkpoints go (default: a temporary directory, removed).")
flags.DEFINE_string("results_page", None, "Write the table to this Markdown page as well.")

RESTORE = os.path.join(ROOT, "integration_tests", "maxtext_interop", "restore_reads.py")


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


def _convert(hf_dir: str, out: str, layout_flags: list[str]) -> dict:
  """The converter binary, timed as a process (wall, peak RSS of the child)."""
  start = time.monotonic()
  child = subprocess.Popen([sys.executable, os.path.join(ROOT, "converter", "main.py"), f"--hf_model_path={hf_dir}",
                            f"--output_dir={out}", "--overwrite", "--noprogress", *layout_flags],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=ROOT))
  _, status, usage = os.wait4(child.pid, 0)  # This child's own peak, not the restores' before it.
  if os.waitstatus_to_exitcode(status):
    raise RuntimeError(f"converting {hf_dir} with {layout_flags} failed (exit {os.waitstatus_to_exitcode(status)})")
  return {"seconds": time.monotonic() - start, "peak_mib": usage.ru_maxrss / 1024}


def _stored_bytes(items: str) -> int:
  step = os.path.dirname(items)
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(step) for f in fs)


def _restore(items: str, model: str, mesh: str) -> tuple[int, float]:
  """(bytes all processes read, slowest process's seconds) of MaxText restoring `items` on `mesh`."""
  from converter.output.record import ConversionRecord  # pylint: disable=g-import-not-at-top
  from tools.ports import free_port  # pylint: disable=g-import-not-at-top

  overrides = os.path.join(os.path.dirname(items), "overrides.json")
  with open(overrides, "w", encoding="utf-8") as f:
    json.dump(ConversionRecord.read(items).maxtext_overrides, f)
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
  address = f"127.0.0.1:{free_port()}"
  children = [subprocess.Popen(
      [FLAGS.maxtext_python, RESTORE, f"--checkpoint={items}", f"--model_name={model}", f"--overrides=@{overrides}",
       f"--mesh={mesh}", f"--process_id={i}", f"--num_processes={FLAGS.processes}",
       f"--devices_per_process={FLAGS.devices_per_process}", f"--coordinator={address}"],
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env) for i in range(FLAGS.processes)]
  results = []
  for child in children:
    out, _ = child.communicate(timeout=900)
    if child.returncode:
      raise RuntimeError(f"MaxText restore of {items} on {mesh} failed (exit {child.returncode})")
    results.append(json.loads([line for line in out.splitlines() if line.startswith("{")][-1]))
  return sum(r["rchar"] for r in results), max(r["seconds"] for r in results)


def _predicted(items: str, meshes: list[str]) -> list[str]:
  from converter import chunking, layout_inspection  # pylint: disable=g-import-not-at-top

  leaves = list(layout_inspection.stored_leaves(items)[0].values())
  return [f"{chunking.predicted_amplification(leaves, chunking.parse_mesh(m))[0]:.2f}" for m in meshes]


def main(argv: list[str]) -> None:
  del argv
  from tools import synthetic_checkpoint  # pylint: disable=g-import-not-at-top

  work = FLAGS.work_dir or tempfile.mkdtemp(prefix="restore_bench_")
  devices = FLAGS.processes * FLAGS.devices_per_process
  fsdp = f"fsdp={devices}"
  layouts = {"default": [], f"--target_mesh={FLAGS.target_mesh}": [f"--target_mesh={FLAGS.target_mesh}"],
             "write blocks (before)": ["--nochunk_layout"]}
  rows = []
  header = (f"| shape | layout | restore mesh ({FLAGS.processes} x {FLAGS.devices_per_process}) | read / stored"
            f" (measured) | predicted | restore s | predicted at fsdp=64 / 256 | stored MB | convert s (median) |"
            f" peak RSS MiB |")
  print(header, flush=True)
  for shape in FLAGS.shapes:
    model, config, shapes = _shapes()[shape]
    hf_dir = os.path.join(work, shape, "hf")
    if not os.path.exists(os.path.join(hf_dir, "config.json")):
      synthetic_checkpoint.write_checkpoint(hf_dir, config, list(shapes(config)))
    for name, layout_flags in layouts.items():
      out = os.path.join(work, shape, name.split("=")[0].strip("-").split()[0])
      runs = [_convert(hf_dir, out, layout_flags) for _ in range(FLAGS.runs)]
      items = os.path.join(out, "0", "items")
      mesh = FLAGS.target_mesh if layout_flags[:1] == [f"--target_mesh={FLAGS.target_mesh}"] else fsdp
      read, seconds = _restore(items, model, mesh)
      stored = _stored_bytes(items)
      predicted, at_64, at_256 = _predicted(items, [mesh, "fsdp=64", "fsdp=256"])
      row = (f"| {shape} | {name} | {mesh} | {read / stored:.2f}x | {predicted}x | {seconds:.1f} | {at_64}x / {at_256}x"
             f" | {stored / 1e6:.1f} | {statistics.median(r['seconds'] for r in runs):.1f} |"
             f" {statistics.median(r['peak_mib'] for r in runs):.0f} |")
      rows.append(row)
      print(row, flush=True)
  if FLAGS.results_page:
    with open(FLAGS.results_page, "w", encoding="utf-8") as f:
      f.write("# Restore read amplification (tools/restore_benchmark.py)\n\n"
              f"Written by `tools/restore_benchmark.py` on {datetime.date.today()}: MaxText 0.2.5's `from_pretrained`"
              f" restoring each checkpoint in {FLAGS.processes} processes of {FLAGS.devices_per_process} CPU devices"
              " joined by jax.distributed on 127.0.0.1. \"read / stored\": the sum of each process's /proc/self/io"
              " rchar during the restore over the bytes stored (metadata reads included); \"predicted\": from the"
              " stored chunk grid alone (hosts of 4 devices, each reading every chunk its devices touch once)."
              f" Conversion time and peak RSS: medians of {FLAGS.runs} runs on this machine.\n\n")
      f.write(header + "\n|" + "---|" * 10 + "\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
  app.run(main)
