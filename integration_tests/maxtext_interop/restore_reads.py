"""One process of a MaxText 0.2.5 restore on a mesh of several CPU processes: the bytes it reads, and how long.

Runs under the MaxText venv (.mtvenv), one process per simulated host, joined by JAX's distributed runtime on
127.0.0.1 (tools/restore_benchmark.py starts them):

  python restore_reads.py --checkpoint=OUT/0/items --model_name=qwen3-8b --overrides=@overrides.json \
      --mesh=fsdp=16 --process_id=0 --num_processes=4 --devices_per_process=4 --coordinator=127.0.0.1:PORT

MaxText's own loader restores the checkpoint on the mesh (`model_creation_utils.from_pretrained`: the NNX model's
shardings from its logical axes and the default `logical_axis_rules`, the ici parallelism given by --mesh), as
an NNX model's creation does; with --loader=training, as a training job's start does (the train state built
first, then `checkpointing.load_state_if_possible` from load_parameters_path). With
--source_layout=safetensors_dynamic (training only), --checkpoint is a directory of HuggingFace safetensors that
MaxText loads and transforms on the devices at every start instead (no conversion): its HuggingFace config for
--model_name comes from a built-in table, which this process points at the directory's own config.json, so that a
checkpoint of other dimensions than the stock model's loads. Prints one JSON line: this process's `/proc/self/io`
rchar during the load (all file bytes it read: Orbax's tensorstore reads of chunks and indices, the checkpoint's
metadata) and the seconds.
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


def _use_checkpoint_config(model_name: str, hf_dir: str) -> None:
  """MaxText's `safetensors_dynamic` reads the HuggingFace config of `model_name` from its table; give it the
  checkpoint's own."""
  import transformers  # pylint: disable=import-outside-toplevel
  from maxtext.checkpoint_conversion.utils import load_dynamic  # pylint: disable=import-outside-toplevel

  load_dynamic.HF_MODEL_CONFIGS[model_name.replace("-Instruct", "")] = transformers.AutoConfig.from_pretrained(hf_dir)


def _training_start(config, mesh):
  """What a training job's start restores (maxtext_utils.setup_training_state): the abstract train state of the
  NNX model and its optimizer, built before the clock starts; the returned call loads the parameters as
  checkpointing.load_state_if_possible does from load_parameters_path."""
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from maxtext.common import checkpointing, train_state_nnx  # pylint: disable=import-outside-toplevel
  from maxtext.utils import maxtext_utils, model_creation_utils, train_utils  # pylint: disable=import-outside-toplevel

  create_model, _ = model_creation_utils.create_nnx_abstract_model(config, mesh)
  _, tx = train_utils.create_training_optimizer(config, model_creation_utils.from_config(config, mesh=mesh))

  def init_state():
    model = create_model()
    return train_state_nnx.TrainStateNNX(model, nnx.Optimizer(model, tx, wrt=nnx.Param))

  abstract, _, _ = maxtext_utils.get_abstract_state(config, mesh, init_state, is_training=True)

  def load():
    _, params = checkpointing.load_state_if_possible(
        None, None, config.load_parameters_path, "", config.checkpoint_storage_concurrent_gb, abstract,
        use_ocdbt=config.checkpoint_storage_use_ocdbt, use_zarr3=config.checkpoint_storage_use_zarr3,
        source_checkpoint_layout=config.source_checkpoint_layout, maxtext_config=config)
    return params

  return load


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
  p.add_argument("--source_layout", choices=["orbax", "safetensors_dynamic"], default="orbax")
  p.add_argument("--loader", choices=["from_pretrained", "training"], default="from_pretrained",
                 help="from_pretrained: the NNX model's loader; training: a training job's start"
                 " (checkpointing.load_state_if_possible with load_parameters_path), the only one that reads"
                 " safetensors_dynamic")
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
  if args.source_layout == "safetensors_dynamic":
    _use_checkpoint_config(args.model_name, args.checkpoint)
    overrides["source_checkpoint_layout"] = "safetensors_dynamic"
  config = maxtext_logits.build_config(args.model_name, overrides, batch=1, seq=8,
                                       load_parameters_path=args.checkpoint)
  mesh = maxtext_utils.get_mesh_from_config(config)
  if args.loader == "training":
    load = _training_start(config, mesh)
  else:
    load = lambda: nnx.state(model_creation_utils.from_pretrained(config, mesh=mesh))
  before, start = _rchar(), time.monotonic()
  with nn_partitioning.axis_rules(config.logical_axis_rules):
    jax.block_until_ready(jax.tree_util.tree_leaves(load()))
  seconds, read = time.monotonic() - start, _rchar() - before
  print(json.dumps({"process": args.process_id, "rchar": read, "seconds": seconds}), flush=True)
  jax.distributed.shutdown()
  return 0


if __name__ == "__main__":
  sys.exit(main())
