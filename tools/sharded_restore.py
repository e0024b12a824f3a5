"""One process of a restore as MaxText 0.2.5's loader makes it (stock Orbax v1 `load` of every leaf as a jax.Array
sharded by its logical axes over all processes' devices on `fsdp`), for the restore benchmark's bucket rows.

  python tools/sharded_restore.py --checkpoint=gs://bucket/OUT/0/items --process_id=0 --num_processes=4 \
      --devices_per_process=4 --coordinator=127.0.0.1:PORT [--logical_axes_from=OUT/0/items] [--save_to=DIR]

Runs in this project's venv (gcsfs for gs:// paths; MaxText's venv has none), pointed at a bucket through the
environment (STORAGE_EMULATOR_HOST, TENSORSTORE_GCS_HTTP_URL). --save_to writes what it restored with stock Orbax
from the same mesh: one chunk per device shard, each process's shards in its own files, the layout MaxText's
`reshard_checkpoint` makes (the benchmark's pre-sharded row). Prints one JSON line: the restore's seconds.
"""

from __future__ import annotations

import json
import os
import sys
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("checkpoint", None, "OUT/0/items, local or gs://.", required=True)
flags.DEFINE_string("logical_axes_from", None, "A checkpoint of ours whose record names the leaves' logical axes"
                    " (default: --checkpoint itself).")
flags.DEFINE_integer("process_id", None, "This process.", required=True)
flags.DEFINE_integer("num_processes", None, "Processes joined by jax.distributed.", required=True)
flags.DEFINE_integer("devices_per_process", 4, "CPU devices per process.")
flags.DEFINE_string("coordinator", None, "127.0.0.1:PORT of JAX's coordinator.", required=True)
flags.DEFINE_string("save_to", None, "Save the restored tree here (step directory).")


def main(argv: list[str]) -> None:
  del argv
  os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={FLAGS.devices_per_process}"
  os.environ["JAX_PLATFORMS"] = "cpu"
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import jax  # pylint: disable=import-outside-toplevel
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

  from converter import storage  # pylint: disable=import-outside-toplevel
  from tools import checkpoint_io  # pylint: disable=import-outside-toplevel

  storage.configure_emulator()
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=FLAGS.coordinator, num_processes=FLAGS.num_processes,
                             process_id=FLAGS.process_id)
  mesh = checkpoint_io.fsdp_mesh(jax.devices())  # Every process's devices.
  abstract = checkpoint_io.sharded_abstract_tree(FLAGS.checkpoint, mesh,
                                                 logical_axes_from=FLAGS.logical_axes_from)
  start = time.monotonic()
  tree = checkpoint_io.restore_v1_sharded(FLAGS.checkpoint, abstract)
  jax.block_until_ready(jax.tree_util.tree_leaves(tree))
  seconds = time.monotonic() - start
  if FLAGS.save_to:
    ocp.v1.save_pytree(FLAGS.save_to, tree)
  print(json.dumps({"process": FLAGS.process_id, "seconds": seconds}), flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  app.run(main)
