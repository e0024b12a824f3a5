"""A genuine MaxText 0.2.5 LoRA checkpoint and MaxText's own LoRA logits (runs under .mtvenv, like
maxtext_logits.py).

  python maxtext_lora.py --checkpoint=BASE/0/items --model_name=qwen3-8b --overrides=@overrides.json \
      --token_ids=ids.npy --lora_rank=4 --lora_alpha=12 --output=logits.npy --lora_output=LORA_DIR

  1. loads the converted base checkpoint with MaxText's NNX loader (`model_creation_utils.from_pretrained`) and
     applies LoRA as MaxText's post-training does (`lora_utils.apply_lora_to_model`: qwix's LoraProvider on the
     family's default `lora_module_path`, every attention and MLP projection);
  2. draws every LoRA factor at random (qwix initialises lora_b to zeros, which would hide a dropped adapter);
  3. saves the model state with MaxText's own `checkpointing.save_checkpoint` (Linen layout, LoRA leaves only,
     `lora` {lora_rank, lora_alpha} in the step's custom_metadata) into LORA_DIR/0;
  4. runs the LoRA model's float32 forward (qwix adds (alpha / r) x @ lora_a @ lora_b to each projection) and
     saves its logits: what the exported PEFT adapter must reproduce in peft.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import maxtext_logits  # noqa: E402  pylint: disable=wrong-import-position


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint", required=True, help="OUT/0/items of the converted base checkpoint")
  p.add_argument("--model_name", required=True)
  p.add_argument("--overrides", default="", help="JSON object of MaxText config overrides, or @file.json")
  p.add_argument("--token_ids", required=True)
  p.add_argument("--lora_rank", type=int, default=4)
  p.add_argument("--lora_alpha", type=float, default=12.0)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--output", required=True, help="MaxText's LoRA logits (.npy)")
  p.add_argument("--lora_output", default="", help="directory MaxText saves the LoRA checkpoint into (step 0)")
  p.add_argument("--lora_restore_path", default="", help="instead of drawing and saving factors: restore them as"
                 " MaxText's LoRA training does (lora.lora_restore_path, rank and alpha from its metadata)")
  args = p.parse_args(argv)

  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from flax.linen import partitioning as nn_partitioning  # pylint: disable=import-outside-toplevel
  from maxtext.common.common_types import MODEL_MODE_TRAIN  # pylint: disable=import-outside-toplevel
  from maxtext.utils import lora_utils, maxtext_utils, model_creation_utils  # pylint: disable=import-outside-toplevel

  ids = np.load(args.token_ids).astype(np.int32)
  batch, seq = ids.shape
  lora = ({"enable_lora": True, "lora_restore_path": args.lora_restore_path} if args.lora_restore_path
          else {"enable_lora": True, "lora_rank": args.lora_rank, "lora_alpha": args.lora_alpha})
  overrides = dict(maxtext_logits._parse_overrides(args.overrides), lora=lora)  # pylint: disable=protected-access
  config = maxtext_logits.build_config(args.model_name, overrides, batch=batch, seq=max(seq, 2),
                                       load_parameters_path=args.checkpoint)
  mesh = maxtext_utils.get_mesh_from_config(config, jax.devices()[:1])
  lora_utils.sync_lora_metadata(config)  # The restored checkpoint's rank and alpha, before LoRA is applied.
  with nn_partitioning.axis_rules(config.logical_axis_rules):
    model = model_creation_utils.from_pretrained(config, mesh=mesh, model_mode=MODEL_MODE_TRAIN)
  with jax.set_mesh(mesh), nn_partitioning.axis_rules(config.logical_axis_rules):
    model = lora_utils.apply_lora_to_model(model, mesh, config)
  if args.lora_restore_path:
    with jax.set_mesh(mesh), nn_partitioning.axis_rules(config.logical_axis_rules):
      model = lora_utils.restore_lora_from_path(model, config)
  else:
    _draw_and_save(model, config, args)

  def forward_fn(model, tokens, positions, segment_ids):
    return model(tokens, positions, decoder_segment_ids=segment_ids, enable_dropout=False, model_mode=MODEL_MODE_TRAIN)

  positions = np.broadcast_to(np.arange(seq, dtype=np.int32)[None, :], (batch, seq))
  with jax.set_mesh(mesh), nn_partitioning.axis_rules(config.logical_axis_rules):
    logits = nnx.jit(forward_fn)(model, jnp.asarray(ids), jnp.asarray(positions), jnp.ones((batch, seq), jnp.int32))
  np.save(args.output, np.asarray(jax.device_get(logits), dtype=np.float32))
  return 0


def _draw_and_save(model, config, args) -> None:
  """Every factor drawn at random, then the state saved as MaxText's LoRA training saves it."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from maxtext.common import checkpointing, train_state_nnx  # pylint: disable=import-outside-toplevel

  rng = np.random.default_rng(args.seed)
  factors = 0
  for _, variable in nnx.iter_graph(model):
    if isinstance(variable, nnx.LoRAParam):
      value = variable.get_value()
      variable.set_value(jnp.asarray(0.1 * rng.standard_normal(value.shape), dtype=value.dtype))
      factors += 1
  print(f"[maxtext_lora] {factors} LoRA factors drawn (rank {args.lora_rank}, alpha {args.lora_alpha:g})",
        file=sys.stderr)

  manager = checkpointing.create_orbax_checkpoint_manager(os.path.abspath(args.lora_output), True, False, 1)
  checkpointing.save_checkpoint(manager, 0, nnx.state(train_state_nnx.TrainStateNNX(model, None)), config,
                                force=True)
  if hasattr(manager, "wait_until_finished"):
    manager.wait_until_finished()


if __name__ == "__main__":
  sys.exit(main())
