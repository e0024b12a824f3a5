"""One process of a MaxText 0.2.5 restore on a mesh of several CPU processes: the bytes it reads, and how long.

Runs under the MaxText venv (.mtvenv), one process per simulated host, joined by JAX's distributed runtime on
127.0.0.1 (tools/restore_benchmark.py starts them):

  python restore_reads.py --checkpoint=OUT/0/items --model_name=qwen3-8b --overrides=@overrides.json \
      --mesh=fsdp=16 --process_id=0 --num_processes=4 --devices_per_process=4 --coordinator=127.0.0.1:PORT

MaxText's own loader restores the checkpoint on the mesh (`model_creation_utils.from_pretrained`: the NNX model's
shardings from its logical axes and the default `logical_axis_rules`, the ici parallelism given by --mesh), as a
training job's first step does. Prints one JSON line: this process's `/proc/self/io` rchar during the restore (all
file bytes it read: Orbax's tensorstore reads of chunks and indices, the checkpoint's metadata) and the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _rchar() -> int:
  with open("/proc/self/io", encoding="ascii") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def main() -> int:
  p = argparse.ArgumentParser()
  p.add_argument("--checkpoint", required=True)
  p.add_argument("--model_name", required=True)
  p.add_argument("--overrides", required=True)
  p.add_argument("--mesh", required=True, help="MaxText ici parallelism, e.g. fsdp=16 or fsdp=8,tensor=2")
  p.add_argument("--process_id", type=int, required=True)
  p.add_argument("--num_processes", type=int, required=True)
  p.add_argument("--devices_per_process", type=int, default=4)
  p.add_argument("--coordinator", required=True)
  args = p.parse_args()

  os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices_per_process}"
  os.environ["JAX_PLATFORMS"] = "cpu"
  import jax  # pylint: disable=import-outside-toplevel

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes,
                             process_id=args.process_id)
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import maxtext_logits  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from flax.linen import partitioning as nn_partitioning  # pylint: disable=import-outside-toplevel
  from maxtext.utils import maxtext_utils, model_creation_utils  # pylint: disable=import-outside-toplevel

  overrides = maxtext_logits._parse_overrides(args.overrides)  # pylint: disable=protected-access
  for part in args.mesh.split(","):
    axis, size = part.split("=")
    overrides[f"ici_{axis}_parallelism"] = int(size)
  config = maxtext_logits.build_config(args.model_name, overrides, batch=1, seq=8,
                                       load_parameters_path=args.checkpoint)
  mesh = maxtext_utils.get_mesh_from_config(config)
  before, start = _rchar(), time.monotonic()
  with nn_partitioning.axis_rules(config.logical_axis_rules):
    model = model_creation_utils.from_pretrained(config, mesh=mesh)
  jax.block_until_ready(jax.tree_util.tree_leaves(nnx.state(model)))
  seconds, read = time.monotonic() - start, _rchar() - before
  print(json.dumps({"process": args.process_id, "rchar": read, "seconds": seconds}), flush=True)
  jax.distributed.shutdown()
  return 0


if __name__ == "__main__":
  sys.exit(main())
