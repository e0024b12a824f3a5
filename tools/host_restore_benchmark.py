"""What one host pays to restore a converted checkpoint onto its own devices, against the checkpoint stock Orbax
saves from that mesh and against the floor of the same bytes, all measured in one run.

  PYTHONPATH=. .venv/bin/python tools/host_restore_benchmark.py --size_gb=3.85 --cpu_devices=4 \
      --results_page=docs/host-restore-results.md
  # On an accelerator host: --cpu_devices=0 restores onto every local device of JAX's default backend.

A Llama-3.1-8B-shaped bf16 checkpoint of random values (tools/synthetic_checkpoint.py) is converted with the
default layout, with --nochunk_layout (the write blocks as the only chunks) and with --target_mesh=fsdp=N for
this host's N devices (chunks cut at exactly its devices' shards); the default one, restored onto the host's
mesh, is saved again by stock Orbax v1 from there (the pre-sharded checkpoint: one chunk per device shard,
MaxText's `reshard_checkpoint`). Each round then restores each checkpoint in a fresh process, in alternating order,
its files first read into the page cache (the HuggingFace files deleted once the floor is measured),
as MaxText 0.2.5 does (`load_params_from_path`: Orbax v1 `load` with a `NamedSharding` per leaf, every device on `fsdp`,
each leaf cut by its recorded logical axes: tools/checkpoint_io.py) and times the restore call until every array is
ready. The floor, in a fresh process of the same kind: the stored files read by as many threads as the host has
cores, their bytes decoded by zstd on every core from memory into memory (tensorstore, the largest chunks a layout
stores, a piece in flight per core: floors.decode_floor) and the same leaves copied from host memory onto the
devices with their shardings. No restore can beat the largest of the three (all overlapped) and none needs more
than their sum (none overlapped).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

FLAGS = flags.FLAGS
flags.DEFINE_float("size_gb", 3.85, "Size of the bf16 checkpoint (GB of tensor data).")
flags.DEFINE_integer("rounds", 5, "Restores of each checkpoint, one per round, in alternating order.")
flags.DEFINE_integer("cpu_devices", 4, "Restore onto this many CPU devices; 0: every local device of JAX's default"
                     " backend (an accelerator host).")
flags.DEFINE_string("work_dir", None, "Where checkpoints go (default: a temporary directory, removed).")
flags.DEFINE_string("results_page", None, "Add the table to this Markdown page.")
flags.DEFINE_enum("child", None, ["restore", "floor"], "Internal: what a child process does.")
flags.DEFINE_string("checkpoint", None, "Internal: the child's OUT/0/items.")
flags.DEFINE_string("axes_from", None, "Internal: the checkpoint of ours whose record names the logical axes.")
flags.DEFINE_string("save_to", None, "Internal: the step directory a restore child saves what it restored to.")
flags.DEFINE_string("hf_dir", None, "Internal: the safetensors the floor child decodes.")

LAYOUTS = ("default", "target_mesh", "nochunk", "presharded")


def _with_root_on_path() -> dict[str, str]:
  return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))


def _child_env() -> dict[str, str]:
  env = _with_root_on_path()
  if FLAGS.cpu_devices:
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={FLAGS.cpu_devices}")
  return env


def _run_child(child: str, checkpoint: str, axes_from: str, **extra: str) -> dict:
  command = [sys.executable, os.path.abspath(__file__), f"--child={child}", f"--checkpoint={checkpoint}",
             f"--axes_from={axes_from}", f"--cpu_devices={FLAGS.cpu_devices}",
             *(f"--{k}={v}" for k, v in extra.items())]
  result = subprocess.run(command, env=_child_env(), capture_output=True, text=True, check=False)
  if result.returncode and "lockfile" in result.stderr:  # A TPU can refuse a process started as the last ended.
    time.sleep(5)
    result = subprocess.run(command, env=_child_env(), capture_output=True, text=True, check=False)
  if result.returncode:
    raise RuntimeError(f"{child} of {checkpoint} failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
  return json.loads(result.stdout.strip().splitlines()[-1])


def _convert(hf_dir: str, out: str, *layout_flags: str) -> str:
  result = subprocess.run([sys.executable, os.path.join(ROOT, "converter", "main.py"), f"--hf_model_path={hf_dir}",
                           f"--output_dir={out}", "--overwrite", "--noprogress", *layout_flags],
                          env=_with_root_on_path(), capture_output=True, text=True, check=False)
  if result.returncode:
    raise RuntimeError(f"converting {hf_dir} {layout_flags} failed:\n{result.stderr[-3000:]}")
  return os.path.join(out, "0", "items")


def _stored_bytes(items: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(items) for f in fs)


def _mesh_and_abstract():
  import jax  # pylint: disable=g-import-not-at-top

  from tools import checkpoint_io  # pylint: disable=g-import-not-at-top

  mesh = checkpoint_io.fsdp_mesh(jax.local_devices())
  return mesh, checkpoint_io.sharded_abstract_tree(FLAGS.checkpoint, mesh, logical_axes_from=FLAGS.axes_from)


def _child_restore() -> dict:
  import jax  # pylint: disable=g-import-not-at-top

  from tools import checkpoint_io  # pylint: disable=g-import-not-at-top

  mesh, abstract = _mesh_and_abstract()
  start = time.monotonic()
  tree = checkpoint_io.restore_v1_sharded(FLAGS.checkpoint, abstract)
  jax.block_until_ready(jax.tree_util.tree_leaves(tree))
  seconds = time.monotonic() - start
  if FLAGS.save_to:
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

    ocp.v1.save_pytree(FLAGS.save_to, tree)
  return {"seconds": seconds, "devices": mesh.devices.size, "platform": jax.default_backend()}


def _child_floor() -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from tools import floors  # pylint: disable=g-import-not-at-top

  files = [os.path.join(d, f) for d, _, fs in os.walk(FLAGS.checkpoint) for f in fs]
  stored = sum(os.path.getsize(f) for f in files)

  def read(path: str) -> int:
    buffer, total = bytearray(16 << 20), 0
    with open(path, "rb", buffering=0) as f:
      while n := f.readinto(buffer):
        total += n
    return total

  start = time.monotonic()
  with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
    assert sum(pool.map(read, files)) == stored
  read_seconds = time.monotonic() - start

  _, abstract = _mesh_and_abstract()
  leaves = [leaf for leaf in jax.tree_util.tree_leaves(abstract) if isinstance(leaf, jax.ShapeDtypeStruct)]
  logical = sum(leaf.size * leaf.dtype.itemsize for leaf in leaves)
  decode_seconds = floors.decode_floor(FLAGS.hf_dir, logical)

  host = [np.ones(leaf.shape, leaf.dtype) for leaf in leaves]
  copies = []
  for _ in range(2):  # The first pays the devices' first allocations; a restore's arrays pay them too.
    start = time.monotonic()
    jax.block_until_ready([jax.device_put(value, leaf.sharding) for value, leaf in zip(host, leaves)])
    copies.append(time.monotonic() - start)
  return {"read": read_seconds, "decode": decode_seconds, "copy": min(copies), "stored": stored,
          "logical": logical}


def _table(rows: dict[str, list[float]], floor: dict, stored: dict[str, int], platform: str, devices: int) -> str:
  presharded = statistics.median(rows["presharded"])
  lowest, serial = max(floor["read"], floor["decode"], floor["copy"]), floor["read"] + floor["decode"] + floor["copy"]
  names = {"default": "default", "target_mesh": f"--target_mesh=fsdp={devices} (this host's shards)",
           "nochunk": "--nochunk_layout (write blocks as chunks)",
           "presharded": "pre-sharded (stock Orbax saved from this mesh)"}
  lines = [
      f"## One host: {platform}, {devices} device{'s' if devices != 1 else ''}, {FLAGS.size_gb:g} GB bf16 Llama-shaped ({datetime.date.today()})",
      "",
      f"Written by `tools/host_restore_benchmark.py --size_gb={FLAGS.size_gb:g} --cpu_devices={FLAGS.cpu_devices}"
      f" --rounds={FLAGS.rounds}` on a host of {os.cpu_count()} cores: each checkpoint restored in a fresh process"
      " per round, in alternating order, its files in the page cache, as MaxText 0.2.5 restores (Orbax v1 `load`"
      " with a `NamedSharding` per leaf, every device on `fsdp`); the restore call until every array is ready. Floor,"
      f" measured in the same run: the stored files read by {os.cpu_count()} threads {floor['read']:.2f} s,"
      f" {floor['logical'] / 1e9:.2f} GB decoded by zstd on every core {floor['decode']:.2f} s, the same leaves"
      f" copied from host memory onto the devices {floor['copy']:.2f} s; all overlapped {lowest:.2f} s, none"
      f" {serial:.2f} s.",
      "",
      "| layout | stored GB | restore s (median) | runs | / pre-sharded | / floor (overlapped) | / floor (serial) |",
      "|---|---|---|---|---|---|---|",
  ]
  for layout in LAYOUTS:
    median = statistics.median(rows[layout])
    runs = ", ".join(f"{s:.2f}" for s in rows[layout])
    lines.append(f"| {names[layout]} | {stored[layout] / 1e9:.2f} | {median:.2f} | {runs} | {median / presharded:.2f}x"
                 f" | {median / lowest:.2f}x | {median / serial:.2f}x |")
  return "\n".join(lines) + "\n"


def _add_to_page(page: str, table: str) -> None:
  text = ("# One host's restore (tools/host_restore_benchmark.py)\n\nEach run adds its section on top: a checkpoint"
          " of ours restored by one host onto its own devices, against what stock Orbax saves from that mesh and"
          " against the floor of the same bytes (the tool's docstring says how each is measured).\n")
  if os.path.exists(page):
    with open(page, encoding="utf-8") as f:
      text = f.read()
  head, _, rest = text.partition("\n## ")
  with open(page, "w", encoding="utf-8") as f:
    f.write(head.rstrip("\n") + "\n\n" + table + ("\n## " + rest if rest else ""))


def benchmark(work: str) -> str:
  from tools import benchmark_runner  # pylint: disable=g-import-not-at-top
  from tools import checkpoint_io  # pylint: disable=g-import-not-at-top
  from tools import floors  # pylint: disable=g-import-not-at-top
  from tools import synthetic_checkpoint as synthetic  # pylint: disable=g-import-not-at-top

  hf_dir = os.path.join(work, "hf")
  config = synthetic.llama_for_bytes(int(FLAGS.size_gb * 1e9))
  synthetic.write_checkpoint(hf_dir, config, list(synthetic.llama_shapes(config)))
  items = {"default": _convert(hf_dir, os.path.join(work, "default")),
           "nochunk": _convert(hf_dir, os.path.join(work, "nochunk"), "--nochunk_layout")}
  presharded = os.path.join(work, "presharded", "0")
  saved = _run_child("restore", items["default"], items["default"], save_to=presharded)
  items["presharded"] = checkpoint_io.saved_items(presharded)
  items["target_mesh"] = _convert(hf_dir, os.path.join(work, "target_mesh"), f"--target_mesh=fsdp={saved['devices']}")
  floor = _run_child("floor", items["default"], items["default"], hf_dir=hf_dir)
  shutil.rmtree(hf_dir)  # Its page cache would crowd out the checkpoints' (and their restores' memory) below.

  def restore(layout: str) -> float:
    floors.warm(items[layout])  # Each restore reads from the page cache, as the read floor does.
    return _run_child("restore", items[layout], items["default"])["seconds"]

  def report(round_index: int, seconds: dict[str, list[float]]) -> None:
    print(f"round {round_index + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in seconds.items()), flush=True)

  rows = benchmark_runner.alternating([(layout, functools.partial(restore, layout)) for layout in LAYOUTS],
                                      FLAGS.rounds, report)
  return _table(rows, floor, {layout: _stored_bytes(path) for layout, path in items.items()}, saved["platform"],
                saved["devices"])


def _from_where_run(path: str) -> str:
  """`path` as the user meant it: relative to where `bazel run` was started, not to its runfiles."""
  return os.path.abspath(os.path.join(os.environ.get("BUILD_WORKING_DIRECTORY", os.getcwd()), path))


def main(argv: list[str]) -> None:
  del argv
  if FLAGS.child:
    print(json.dumps({"restore": _child_restore, "floor": _child_floor}[
        FLAGS.child]()), flush=True)
    return
  if FLAGS.work_dir:
    os.makedirs(_from_where_run(FLAGS.work_dir), exist_ok=True)
    table = benchmark(_from_where_run(FLAGS.work_dir))
  else:
    from converter.storage import scratch  # pylint: disable=g-import-not-at-top

    with scratch.directory("host-restore-benchmark") as work:
      table = benchmark(work)
  print(table)
  if FLAGS.results_page:
    _add_to_page(_from_where_run(FLAGS.results_page), table)


if __name__ == "__main__":
  app.run(main)
