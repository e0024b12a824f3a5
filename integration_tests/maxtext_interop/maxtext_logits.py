"""Run a converted checkpoint through real MaxText (0.2.5) and save its logits.

Runs under the Python 3.12 venv described in requirements-maxtext.txt (NOT the converter's
3.11 environment): MaxText 0.2.5 needs Python >= 3.12 and PyPI has no CPU torch for 3.12 here,
so transformers reference logits are made elsewhere and compared as .npy files.

Modes
-----
Logits (default)::

  python maxtext_logits.py --checkpoint=OUT/0/items --model_name=qwen3-8b \
      --overrides='{"base_emb_dim": 256, ...}' --token_ids=ids.npy --output=logits.npy \
      [--reference=hf_logits.npy --atol=1e-4]

  1. builds MaxText's config (base.yml + configs/models/<model_name>.yml, override_model_config=True,
     hardware=cpu, attention=dot_product, dtype=weight_dtype=float32, the JSON overrides on top);
  2. compares the checkpoint's stored tree (paths, shapes) with MaxText's abstract parameter tree
     EXACTLY and fails on any difference (MaxText's own loader is lenient: it tiles, transposes and
     ignores extra leaves), unless --allow_tree_mismatch;
  3. loads the params with MaxText's own loader
     ``maxtext.utils.model_creation_utils.setup_decode_state_from_nnx`` (the linen
     ``setup_decode_state`` path is broken in 0.2.5);
  4. runs ``model.apply(params, ids, positions=arange, decoder_segment_ids=ones,
     enable_dropout=False, model_mode="train")`` in float32 and saves logits [batch, seq, vocab].

Param tree::

  python maxtext_logits.py --print_param_tree --model_name=qwen3-8b --overrides='{...}'

  prints MaxText's abstract parameter tree (what its loader restores, i.e. the tree expected under
  ``items/params/params``) without reading any checkpoint: one ``path shape dtype`` line per leaf.

--overrides takes a JSON object, or @path to a JSON file. Keys are MaxText config keys
(base_emb_dim, base_num_query_heads, base_num_kv_heads, head_dim, base_mlp_dim,
base_num_decoder_layers, vocab_size, normalization_layer_epsilon, rope_max_timescale,
logits_via_embedding, scan_layers, num_experts, num_experts_per_tok, base_moe_mlp_dim, ...).
When scan_layers is not given in logits mode it is read from OUT/0/_CHECKPOINT_METADATA.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

# Runtime settings that the harness always imposes (a user override of the same key wins only for
# the keys in _SOFT_DEFAULTS).
_FIXED = {
    "override_model_config": True,
    "hardware": "cpu",
    "skip_jax_distributed_system": True,
    "attention": "dot_product",
    "dtype": "float32",
    "weight_dtype": "float32",
    "enable_checkpointing": False,
    "run_name": "maxtext_logits",
}
_SOFT_DEFAULTS = {
    "matmul_precision": "highest",
}


def _parse_overrides(text: str | None) -> dict:
  if not text:
    return {}
  if text.startswith("@"):
    with open(text[1:], encoding="utf-8") as f:
      text = f.read()
  value = json.loads(text)
  if not isinstance(value, dict):
    raise SystemExit(f"--overrides must be a JSON object, got {type(value).__name__}")
  return value


def _checkpoint_scan_layers(items_path: str):
  """custom_metadata.scan_layers of OUT/0 (the parent of items), or None."""
  meta = os.path.join(os.path.dirname(os.path.normpath(items_path)), "_CHECKPOINT_METADATA")
  try:
    with open(meta, encoding="utf-8") as f:
      value = (json.load(f).get("custom_metadata") or {}).get("scan_layers")
  except FileNotFoundError:
    return None
  return value if isinstance(value, bool) else None


def build_config(model_name: str, overrides: dict, batch: int, seq: int, load_parameters_path: str = ""):
  from maxtext.configs import pyconfig  # pylint: disable=import-outside-toplevel

  kwargs = dict(_SOFT_DEFAULTS)
  kwargs.update(
      {
          "per_device_batch_size": batch,
          "max_target_length": seq,
          "max_prefill_predict_length": max(1, seq // 2),
      }
  )
  kwargs.update(overrides)
  kwargs.update(_FIXED)
  kwargs["model_name"] = model_name
  kwargs["base_output_directory"] = tempfile.mkdtemp(prefix="maxtext_logits_")
  if load_parameters_path:
    kwargs["load_parameters_path"] = os.path.abspath(load_parameters_path)
  base_yml = os.path.join(os.path.dirname(pyconfig.__file__), "base.yml")
  return pyconfig.initialize(["maxtext_logits", base_yml], **kwargs)


def _keystr(path) -> str:
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return "/".join(parts)


def _flatten(tree) -> dict:
  import jax  # pylint: disable=import-outside-toplevel

  flat = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    key = _keystr(path)
    if key.endswith("/value"):  # nnx.Variable / LogicallyPartitioned box
      key = key[: -len("/value")]
    flat[key] = (tuple(leaf.shape), str(np.dtype(leaf.dtype)) if hasattr(leaf, "dtype") else "?")
  return flat


def abstract_param_trees(config, mesh):
  """(nnx_tree, linen_tree): {path: (shape, dtype)} for the loader's NNX model and the linen apply model."""
  import jax  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from maxtext.common.common_types import MODEL_MODE_AUTOREGRESSIVE  # pylint: disable=import-outside-toplevel
  from maxtext.utils import model_creation_utils  # pylint: disable=import-outside-toplevel

  # setup_decode_state_from_nnx -> from_pretrained restores into an NNX model built in autoregressive mode.
  _, abstract_model = model_creation_utils.create_nnx_abstract_model(config, mesh, model_mode=MODEL_MODE_AUTOREGRESSIVE)
  nnx_tree = _flatten(nnx.state(abstract_model, nnx.Param))

  model = model_creation_utils.from_config(config, mesh=mesh)
  ids = np.ones((1, 8), np.int32)
  keys = {"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1), "aqt": jax.random.PRNGKey(2)}
  linen_vars = jax.eval_shape(lambda: model.init(keys, ids, ids))
  linen_tree = {k[len("params/") :]: v for k, v in _flatten(linen_vars).items() if k.startswith("params/")}
  return nnx_tree, linen_tree


def format_tree(tree: dict) -> str:
  return "\n".join(f"{path} {tuple(shape)} {dtype}" for path, (shape, dtype) in sorted(tree.items()))


def checkpoint_tree(items_path: str) -> dict:
  """{path: (shape, dtype)} of the leaves stored under items/params/params."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

  meta = ocp.PyTreeCheckpointer().metadata(os.path.abspath(items_path))
  tree = getattr(meta, "item_metadata", meta)
  tree = getattr(tree, "tree", tree)
  try:
    params = tree["params"]["params"]
  except (KeyError, TypeError) as e:
    raise SystemExit(f"{items_path}: no params/params subtree in the checkpoint ({e!r})") from e
  import jax  # pylint: disable=import-outside-toplevel

  flat = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    shape = tuple(getattr(leaf, "shape", ()) or ())
    dtype = getattr(leaf, "dtype", None)
    flat[_keystr(path)] = (shape, str(np.dtype(dtype)) if dtype is not None else "?")
  return flat


def compare_trees(expected: dict, actual: dict) -> list[str]:
  problems = []
  for k in sorted(set(expected) - set(actual)):
    problems.append(f"missing in checkpoint: {k} {expected[k][0]}")
  for k in sorted(set(actual) - set(expected)):
    problems.append(f"extra in checkpoint (MaxText ignores it): {k} {actual[k][0]}")
  for k in sorted(set(expected) & set(actual)):
    if tuple(expected[k][0]) != tuple(actual[k][0]):
      problems.append(f"shape mismatch: {k} maxtext={expected[k][0]} checkpoint={actual[k][0]}")
  return problems


def run_print_tree(args, overrides):
  import jax  # pylint: disable=import-outside-toplevel
  from maxtext.utils import maxtext_utils  # pylint: disable=import-outside-toplevel

  config = build_config(args.model_name, overrides, batch=1, seq=args.seq_len)
  mesh = maxtext_utils.get_mesh_from_config(config, jax.devices()[:1])
  nnx_tree, linen_tree = abstract_param_trees(config, mesh)
  print(f"# model_name={args.model_name} scan_layers={config.scan_layers} decoder_block={config.decoder_block}")
  print(f"# overrides={json.dumps(overrides, sort_keys=True)}")
  print(format_tree(nnx_tree))
  diff = compare_trees(nnx_tree, linen_tree)
  if diff:
    print("# NOTE: linen apply tree differs from the loader's NNX tree:")
    for line in diff:
      print("#   " + line.replace("checkpoint", "linen"))
  return 0


def run_logits(args, overrides):
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from flax.linen import partitioning as nn_partitioning  # pylint: disable=import-outside-toplevel
  from maxtext.utils import maxtext_utils, model_creation_utils  # pylint: disable=import-outside-toplevel

  for name in ("checkpoint", "token_ids", "output"):
    if not getattr(args, name):
      raise SystemExit(f"--{name} is required in logits mode")
  ids = np.load(args.token_ids)
  if ids.ndim == 1:
    ids = ids[None, :]
  if ids.ndim != 2:
    raise SystemExit(f"--token_ids must be [batch, seq], got shape {ids.shape}")
  ids = ids.astype(np.int32)
  batch, seq = ids.shape

  if "scan_layers" not in overrides:
    saved = _checkpoint_scan_layers(args.checkpoint)
    if saved is not None:
      overrides = dict(overrides, scan_layers=saved)
      print(f"[maxtext_logits] scan_layers={saved} (from the checkpoint's custom_metadata)", file=sys.stderr)

  config = build_config(args.model_name, overrides, batch=batch, seq=max(seq, 2), load_parameters_path=args.checkpoint)
  mesh = maxtext_utils.get_mesh_from_config(config, jax.devices()[:1])

  if not args.skip_tree_check:
    nnx_tree, _ = abstract_param_trees(config, mesh)
    problems = compare_trees(nnx_tree, checkpoint_tree(args.checkpoint))
    for line in problems:
      print(f"[maxtext_logits] TREE: {line}", file=sys.stderr)
    if problems and not args.allow_tree_mismatch:
      print(
          f"[maxtext_logits] {len(problems)} tree difference(s) between the checkpoint and MaxText's model; "
          "refusing to run (MaxText's loader would silently tile/transpose/ignore). --allow_tree_mismatch to run anyway.",
          file=sys.stderr,
      )
      return 3
    if not problems:
      print(f"[maxtext_logits] tree check: {len(nnx_tree)} leaves, paths and shapes match exactly", file=sys.stderr)

  model = model_creation_utils.from_config(config, mesh=mesh)
  with mesh, nn_partitioning.axis_rules(config.logical_axis_rules):
    state, _ = model_creation_utils.setup_decode_state_from_nnx(model, config, jax.random.PRNGKey(0), mesh)
    params = state.params
    tokens = jnp.asarray(ids)
    positions = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32)[None, :], (batch, seq))
    segment_ids = jnp.ones((batch, seq), dtype=jnp.int32)
    logits = model.apply(
        params,
        tokens,
        positions,
        decoder_segment_ids=segment_ids,
        enable_dropout=False,
        model_mode="train",
        rngs={"aqt": jax.random.PRNGKey(0)},
    )
  logits = np.asarray(jax.device_get(logits), dtype=np.float32)
  if args.keep_padded_vocab is False and args.vocab and logits.shape[-1] > args.vocab:
    logits = logits[..., : args.vocab]
  os.makedirs(os.path.dirname(os.path.abspath(args.output)) or ".", exist_ok=True)
  np.save(args.output, logits)
  print(f"[maxtext_logits] wrote {args.output} {logits.shape} finite={bool(np.isfinite(logits).all())}", file=sys.stderr)

  if args.reference:
    ref = np.load(args.reference).astype(np.float32)
    v = min(ref.shape[-1], logits.shape[-1])
    if ref.shape[:-1] != logits.shape[:-1]:
      print(f"[maxtext_logits] reference shape {ref.shape} vs logits {logits.shape}", file=sys.stderr)
      return 4
    diff = float(np.max(np.abs(ref[..., :v] - logits[..., :v])))
    print(f"[maxtext_logits] max|maxtext - reference| = {diff:.3e} over vocab[:{v}] (atol {args.atol})")
    if diff > args.atol:
      return 5
  return 0


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint", help="OUT/0/items of a converted checkpoint")
  p.add_argument("--model_name", required=True, help="MaxText model name, e.g. qwen3-8b")
  p.add_argument("--overrides", default="", help="JSON object of MaxText config overrides, or @file.json")
  p.add_argument("--token_ids", help=".npy int [batch, seq]")
  p.add_argument("--output", help="where to save logits .npy [batch, seq, vocab] float32")
  p.add_argument("--reference", help="optional reference logits .npy to compare against")
  p.add_argument("--atol", type=float, default=1e-4, help="max abs difference allowed against --reference")
  p.add_argument("--vocab", type=int, default=0, help="with --no_padded_vocab: cut logits to this vocab")
  p.add_argument("--no_padded_vocab", dest="keep_padded_vocab", action="store_false")
  p.add_argument("--print_param_tree", action="store_true", help="print MaxText's abstract param tree and exit")
  p.add_argument("--seq_len", type=int, default=8, help="max_target_length used for --print_param_tree")
  p.add_argument("--allow_tree_mismatch", action="store_true")
  p.add_argument("--skip_tree_check", action="store_true")
  args = p.parse_args(argv)
  overrides = _parse_overrides(args.overrides)
  if args.print_param_tree:
    return run_print_tree(args, overrides)
  return run_logits(args, overrides)


if __name__ == "__main__":
  sys.exit(main())
