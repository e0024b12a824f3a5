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
     hardware=cpu, attention=dot_product, dtype=float32, weight_dtype=float32 unless the checkpoint records
     another (a native fp8 model: float8_e4m3fn), the JSON overrides on top);
  2. compares the checkpoint's stored tree (paths, shapes, dtypes) EXACTLY with everything MaxText's NNX loader
     restores from it and fails on any difference (the loader itself is lenient: it tiles, transposes
     and ignores extra leaves), unless --allow_tree_mismatch. What it restores is the NNX model state
     minus run-time variables: every ``nnx.Param`` plus non-Param weights such as DeepSeek V3's
     ``MoEBiasVar`` gate bias;
  3. loads the model with MaxText's own NNX loader ``maxtext.utils.model_creation_utils.from_pretrained``
     (from ``load_parameters_path``, train mode);
  4. calls that NNX model directly, ``model(ids, positions=arange, decoder_segment_ids=ones,
     enable_dropout=False, model_mode="train")``, in float32 and saves logits [batch, seq, vocab].
     Not ``setup_decode_state_from_nnx`` + linen ``model.apply``: that path keeps only ``nnx.Param``,
     so DeepSeek V3 would run without its ``MoEBiasVar`` gate bias.

Param tree::

  python maxtext_logits.py --print_param_tree --model_name=qwen3-8b --overrides='{...}'

  prints what MaxText's NNX loader restores (the tree expected under ``items/params/params``) without
  reading any checkpoint: one ``path shape dtype`` line per leaf, followed by the variable class for
  leaves that are not ``nnx.Param`` (e.g. ``MoEBiasVar``).

--overrides takes a JSON object, or @path to a JSON file. Keys are MaxText config keys
(base_emb_dim, base_num_query_heads, base_num_kv_heads, head_dim, base_mlp_dim,
base_num_decoder_layers, vocab_size, normalization_layer_epsilon, rope_max_timescale,
logits_via_embedding, scan_layers, num_experts, num_experts_per_tok, base_moe_mlp_dim, ...).
When scan_layers is not given in logits mode it is read from OUT/0/_CHECKPOINT_METADATA.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
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
    "enable_checkpointing": False,
    "run_name": "maxtext_logits",
}
_SOFT_DEFAULTS = {
    "matmul_precision": "highest",
    "weight_dtype": "float32",  # A native fp8 checkpoint records float8_e4m3fn (its kernels' storage dtype).
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


_base_output_directory: str | None = None


def base_output_directory() -> str:
  """One scratch directory per process for what MaxText writes beside a run (its config asks for one), removed
  when the process exits: a directory per case, never removed, was left in the temporary directory for every
  case of every CI run."""
  global _base_output_directory
  if _base_output_directory is None:
    _base_output_directory = tempfile.mkdtemp(prefix="maxtext_logits_")
    atexit.register(shutil.rmtree, _base_output_directory, ignore_errors=True)
  return _base_output_directory


def jax_cache_dir() -> str:
  """Where MaxText keeps its JAX compilation cache: a named cache of this project's (XDG's cache directory), not
  MaxText's default `~/jax_cache`. A cold cache makes the interop check several times slower (docs/testing.md)."""
  return os.environ.get("HF2MAXTEXT_MAXTEXT_JAX_CACHE") or os.path.join(
      os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hf2maxtext", "maxtext_jax_cache")


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
  kwargs["base_output_directory"] = base_output_directory()
  kwargs["jax_cache_dir"] = jax_cache_dir()
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


def loader_tree(config, mesh) -> dict:
  """{path: (shape, dtype, variable class, logical axes)} of everything MaxText's NNX loader restores from a
  checkpoint; the logical axes are the variable's `out_sharding` (None where MaxText annotates none).

  Mirrors ``model_creation_utils.from_pretrained`` (MaxText 0.2.5): it builds the abstract NNX model with
  ``create_nnx_abstract_model`` in the mode it is given and, for a ``params/params`` checkpoint, requests every
  state variable except run-time ones (``sharded_state.filter(... not RngState/Cache/Intermediate/BatchStat)``,
  utils/model_creation_utils.py:1010) at its NNX state path under ``params/params``. So non-Param weights such as
  DeepSeek V3's ``MoEBiasVar`` gate bias (layers/moe.py:640) must be in the checkpoint at exactly these paths and
  shapes; ``nnx.state(model, nnx.Param)`` alone would miss them.
  """
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from maxtext.common.common_types import MODEL_MODE_TRAIN  # pylint: disable=import-outside-toplevel
  from maxtext.utils import model_creation_utils  # pylint: disable=import-outside-toplevel

  _, abstract_model = model_creation_utils.create_nnx_abstract_model(config, mesh, model_mode=MODEL_MODE_TRAIN)
  restored = nnx.state(abstract_model).filter(
      lambda path, var: not isinstance(var, (nnx.RngState, nnx.Cache, nnx.Intermediate, nnx.BatchStat))
  )
  tree = {}
  for path, var in nnx.to_flat_state(restored):
    leaf = var.get_value()
    axes = var.get_metadata().get("out_sharding")
    tree["/".join(str(k) for k in path)] = (tuple(leaf.shape), str(np.dtype(leaf.dtype)), type(var).__name__,
                                            None if axes is None else tuple(axes))
  return tree


# Logical names MaxText's default rules shard over a mesh axis of a training mesh (data, fsdp, tensor, expert, ...);
# the stacking names (layers -> stage) and unannotated axes are never sharded by a default mesh.
_SHARDED_NAMES = {"vocab", "embed_vocab", "heads", "q_heads", "kv_heads", "q_lora", "kv_lora", "embed_attn", "exp",
                  "mlp_moe", "embed_moe", "embed_router", "mlp", "gdn_head", "embed", "norm"}


def axes_problems(expected: dict, items_path: str) -> list[str]:
  """Every leaf whose logical axes the conversion recorded (hf2maxtext.logical_axes: where its stored chunks are
  cut) differ from MaxText's own. MaxText 0.2.5 names fewer axes than some unannotated leaves have (the hybrid
  decoders' norms): those agree when ours shard nothing either."""
  meta = os.path.join(os.path.dirname(os.path.normpath(items_path)), "_CHECKPOINT_METADATA")
  with open(meta, encoding="utf-8") as f:
    recorded = ((json.load(f).get("custom_metadata") or {}).get("hf2maxtext") or {}).get("logical_axes")
  if recorded is None:
    return ["the checkpoint records no hf2maxtext.logical_axes"]
  problems = []
  for path, (shape, _, _, axes) in sorted(expected.items()):
    if path not in recorded:
      continue  # Leaves the conversion does not lay out by axes (native fp8 scales); the tree check covers them.
    ours = (None,) * len(shape) if recorded[path] is None else tuple(recorded[path])
    theirs = (None,) * len(shape) if axes is None or len(axes) != len(shape) else axes
    if axes is not None and len(axes) != len(shape) and not set(ours) & _SHARDED_NAMES:
      continue
    if ours != tuple(theirs):
      problems.append(f"logical axes of {path}: maxtext={theirs} checkpoint={ours}")
  return problems


def format_tree(tree: dict) -> str:
  """One ``path shape dtype`` line per leaf, plus the variable class where it is not ``nnx.Param``."""
  lines = []
  for path, (shape, dtype, kind, _) in sorted(tree.items()):
    lines.append(f"{path} {tuple(shape)} {dtype}" + ("" if kind == "Param" else f" {kind}"))
  return "\n".join(lines)


def checkpoint_tree(items_path: str) -> tuple[dict, dict]:
  """({path: (shape, dtype)} under items/params/params, {path: (shape, dtype)} of the rest of items/params).

  MaxText reads a checkpoint of this layout only from ``params/params`` (``item_to_restore``,
  utils/model_creation_utils.py:1030), so a leaf elsewhere under ``params``, e.g. a ``params/MoEBiasVar/...``
  collection, is never loaded. The other TrainState fields beside ``params`` (``step``, ``opt_state``) hold no
  weights and are not returned.
  """
  import jax  # pylint: disable=import-outside-toplevel
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

  meta = ocp.PyTreeCheckpointer().metadata(os.path.abspath(items_path))
  tree = getattr(meta, "item_metadata", meta)
  tree = getattr(tree, "tree", tree)
  inside, outside = {}, {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    key = _keystr(path)
    shape = tuple(getattr(leaf, "shape", ()) or ())
    dtype = getattr(leaf, "dtype", None)
    entry = (shape, str(np.dtype(dtype)) if dtype is not None else "?")
    if key.startswith("params/params/"):
      inside[key[len("params/params/") :]] = entry
    elif key.startswith("params/"):
      outside[key] = entry
  if not inside:
    raise SystemExit(f"{items_path}: no leaves under params/params (stored: {', '.join(sorted(outside)) or 'none'})")
  return inside, outside


def compare_trees(expected: dict, actual: dict) -> list[str]:
  problems = []
  for k in sorted(set(expected) - set(actual)):
    problems.append(f"missing in checkpoint: {k} {expected[k][0]}")
  for k in sorted(set(actual) - set(expected)):
    problems.append(f"extra in checkpoint (MaxText ignores it): {k} {actual[k][0]}")
  for k in sorted(set(expected) & set(actual)):
    if tuple(expected[k][0]) != tuple(actual[k][0]):
      problems.append(f"shape mismatch: {k} maxtext={expected[k][0]} checkpoint={actual[k][0]}")
    elif expected[k][1] != actual[k][1]:
      problems.append(f"dtype mismatch: {k} maxtext={expected[k][1]} checkpoint={actual[k][1]}")
  return problems


def tree_problems(expected: dict, items_path: str) -> list[str]:
  """Every difference between what the loader restores (`expected`) and what the checkpoint stores."""
  stored, elsewhere = checkpoint_tree(items_path)
  problems = compare_trees(expected, stored)
  for k, (shape, _) in sorted(elsewhere.items()):
    problems.append(f"in checkpoint outside params/params (MaxText ignores it): {k} {shape}")
  return problems


def run_print_tree(args, overrides):
  import jax  # pylint: disable=import-outside-toplevel
  from maxtext.utils import maxtext_utils  # pylint: disable=import-outside-toplevel

  config = build_config(args.model_name, overrides, batch=1, seq=args.seq_len)
  mesh = maxtext_utils.get_mesh_from_config(config, jax.devices()[:1])
  print(f"# model_name={args.model_name} scan_layers={config.scan_layers} decoder_block={config.decoder_block}")
  print(f"# overrides={json.dumps(overrides, sort_keys=True)}")
  print(format_tree(loader_tree(config, mesh)))
  return 0


def run_logits(args, overrides):
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from flax.linen import partitioning as nn_partitioning  # pylint: disable=import-outside-toplevel
  from maxtext.common.common_types import MODEL_MODE_TRAIN  # pylint: disable=import-outside-toplevel
  from maxtext.utils import maxtext_utils, model_creation_utils  # pylint: disable=import-outside-toplevel

  extra = {}
  if args.inputs:  # A multimodal case: token ids and the arrays of MaxText's model call, in one .npz.
    with np.load(args.inputs) as case:
      extra = {k: case[k] for k in case.files}
    args.token_ids = args.token_ids or args.inputs
  for name in ("checkpoint", "token_ids", "output"):
    if not getattr(args, name):
      raise SystemExit(f"--{name} is required in logits mode")
  ids = extra.pop("token_ids") if "token_ids" in extra else np.load(args.token_ids)
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
    expected = loader_tree(config, mesh)
    problems = tree_problems(expected, args.checkpoint)
    problems += axes_problems(expected, args.checkpoint) if not problems else []
    for line in problems:
      print(f"[maxtext_logits] TREE: {line}", file=sys.stderr)
    if problems and not args.allow_tree_mismatch:
      print(
          f"[maxtext_logits] {len(problems)} tree difference(s) between the checkpoint and what MaxText's loader "
          "restores; refusing to run (the loader would silently tile/transpose/ignore, or crash on a missing leaf). "
          "--allow_tree_mismatch to run anyway.",
          file=sys.stderr,
      )
      return 3
    if not problems:
      kinds = ", ".join(sorted({entry[2] for entry in expected.values()}))
      print(f"[maxtext_logits] tree check: {len(expected)} leaves ({kinds}), paths, shapes and logical axes match"
            " exactly", file=sys.stderr)

  # Run the loaded NNX model itself (linen params made from its state would keep only nnx.Param), jitted as
  # MaxText's own NNX callers do: op-by-op it takes ~6x longer (20 s vs 3.3 s for the unscanned tiny Llama 4).
  def forward_fn(model, tokens, positions, segment_ids, inputs):
    return model(tokens, positions, decoder_segment_ids=segment_ids, enable_dropout=False, model_mode=MODEL_MODE_TRAIN,
                 **inputs)

  forward = nnx.jit(forward_fn)

  # Loaded outside `jax.set_mesh`: under it, Flax rejects the shardings of some decoders' parameters whose logical
  # axes map to one mesh axis twice (Qwen3-Next's gated delta net: DuplicateSpecError), as MaxText's own
  # create_nnx_abstract_model notes; the forward pass runs under the mesh.
  with nn_partitioning.axis_rules(config.logical_axis_rules):
    model = model_creation_utils.from_pretrained(config, mesh=mesh, model_mode=MODEL_MODE_TRAIN)
  rope_index = {k[len(ROPE_INDEX):]: extra.pop(k) for k in [k for k in extra if k.startswith(ROPE_INDEX)]}
  if rope_index:
    extra["decoder_positions"] = rope_index_positions(config, ids, rope_index)
  positions = extra.pop("decoder_positions", None)
  if positions is None:
    positions = np.broadcast_to(np.arange(seq, dtype=np.int32)[None, :], (batch, seq))
  inputs = {k: jnp.asarray(v) for k, v in extra.items()}

  def run() -> np.ndarray:
    with jax.set_mesh(mesh), nn_partitioning.axis_rules(config.logical_axis_rules):
      out = forward(model, jnp.asarray(ids), jnp.asarray(positions), jnp.ones((batch, seq), dtype=jnp.int32), inputs)
    return np.asarray(jax.device_get(out), dtype=np.float32)

  logits = run()
  if args.align:
    # The same checkpoint and inputs with MaxText's known arithmetic differences switched to transformers' for
    # the duration of the forward (no parameter changes): what the checkpoint alone decides.
    import contextlib  # pylint: disable=import-outside-toplevel

    with contextlib.ExitStack() as stack:
      for name in args.align:
        stack.enter_context(ALIGNMENTS[name]())
      forward = nnx.jit(forward_fn)  # Traced afresh under the patches.
      aligned = run()
    np.save(args.aligned_output, aligned)
    print(f"[maxtext_logits] wrote {args.aligned_output} (aligned: {', '.join(args.align)})", file=sys.stderr)
  if args.keep_padded_vocab is False and args.vocab and logits.shape[-1] > args.vocab:
    logits = logits[..., : args.vocab]
  os.makedirs(os.path.dirname(os.path.abspath(args.output)) or ".", exist_ok=True)
  np.save(args.output, logits)
  print(f"[maxtext_logits] wrote {args.output} {logits.shape} finite={bool(np.isfinite(logits).all())}",
        file=sys.stderr)

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


# MaxText 0.2.5 arithmetic that differs from transformers' and no checkpoint can change
# (maxtext-contract-multimodal.md, section 2), each a context manager that switches it to transformers' arithmetic.
ALIGNMENTS: dict = {}

# Case arrays named `rope_index_<argument>` (a Qwen multimodal case: `rope_index_image_grid_thw`, Qwen3-Omni's
# `rope_index_audio_lengths`) are not model-call arguments: they make the decoder positions, computed by MaxText's own
# `get_rope_index` from the token ids (rope_index_positions).
ROPE_INDEX = "rope_index_"


def rope_index_positions(config, ids: np.ndarray, arguments: dict) -> np.ndarray:
  """MaxText's MRoPE positions (B, S, 3) for a Qwen multimodal case, computed as its decode.py computes them
  (`processor_qwen3_omni.get_rope_index`, the special token ids chosen by the model name), with `arguments` (its
  keyword arguments: image_grid_thw, audio_lengths, ...)."""
  from maxtext.multimodal import processor_qwen3_omni  # pylint: disable=import-outside-toplevel

  positions, _ = processor_qwen3_omni.get_rope_index(
      input_ids=ids, attention_mask=np.ones_like(ids), spatial_merge_size=config.spatial_merge_size_for_vit,
      position_id_per_seconds=config.position_id_per_seconds, config=config, **arguments)
  return np.asarray(positions, dtype=np.int32)


def _patched(owner, name: str, replace):
  """A context manager that sets `owner.name` to `replace(original)` and restores the original on exit."""
  import contextlib  # pylint: disable=import-outside-toplevel

  @contextlib.contextmanager
  def patch():
    original = getattr(owner, name)
    setattr(owner, name, replace(original))
    try:
      yield
    finally:
      setattr(owner, name, original)

  return patch()


def _exact_gelu_inside(cls):
  """During `cls.__call__` (and only there), `jax.nn.gelu` is the erf GELU (transformers' `nn.GELU()`) instead of
  MaxText's tanh approximation: the calls MaxText makes elsewhere (the Qwen vision blocks' own tanh MLP) keep it."""
  import functools  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel

  def replace(call):
    @functools.wraps(call)
    def exact(self, *args, **kwargs):
      with _patched(jax.nn, "gelu", lambda gelu: functools.partial(gelu, approximate=False)):
        return call(self, *args, **kwargs)

    return exact

  return _patched(cls, "__call__", replace)


def qwen_vision_pos_embed_f32():
  """Contract section 2 item 2: `Qwen3OmniMoeVisionPosEmbedInterpolate` is built without an fprop dtype and casts
  its interpolated table to bfloat16; transformers adds it in float32. Switched off for the call."""
  import functools  # pylint: disable=import-outside-toplevel

  from maxtext.layers import embeddings  # pylint: disable=import-outside-toplevel

  def replace(call):
    @functools.wraps(call)
    def float32(self, *args, **kwargs):
      cast = self.cast_as_fprop_dtype
      object.__setattr__(self, "cast_as_fprop_dtype", False)
      try:
        return call(self, *args, **kwargs)
      finally:
        object.__setattr__(self, "cast_as_fprop_dtype", cast)

    return float32

  return _patched(embeddings.Qwen3OmniMoeVisionPosEmbedInterpolate, "__call__", replace)


def qwen_merger_exact_gelu():
  """Contract section 2 item 3: the Qwen patch mergers (deepstack and final; `Qwen3OmniMoeVisionPatchMerger`)
  apply tanh GELU where transformers' Qwen3-VL / Qwen3.5 / Qwen3-Omni mergers apply `nn.GELU()` (erf)."""
  from maxtext.models import qwen3  # pylint: disable=import-outside-toplevel

  return _exact_gelu_inside(qwen3.Qwen3OmniMoeVisionPatchMerger)


def omni_audio_exact_gelu():
  """Contract section 2 item 4: Qwen3-Omni's audio tower (its convs, `MlpBlock(("gelu",))` layers) and audio
  projector apply tanh GELU where transformers applies erf GELU (`F.gelu`, `ACT2FN["gelu"]`)."""
  import contextlib  # pylint: disable=import-outside-toplevel

  from maxtext.models import qwen3  # pylint: disable=import-outside-toplevel

  @contextlib.contextmanager
  def tower_and_projector():
    with _exact_gelu_inside(qwen3.Qwen3OmniAudioEncoder), _exact_gelu_inside(qwen3.Qwen3OmniAudioProjector):
      yield

  return tower_and_projector()


ALIGNMENTS.update(qwen_vision_pos_embed_f32=qwen_vision_pos_embed_f32, qwen_merger_exact_gelu=qwen_merger_exact_gelu,
                  omni_audio_exact_gelu=omni_audio_exact_gelu)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint", help="OUT/0/items of a converted checkpoint")
  p.add_argument("--model_name", required=True, help="MaxText model name, e.g. qwen3-8b")
  p.add_argument("--overrides", default="", help="JSON object of MaxText config overrides, or @file.json")
  p.add_argument("--token_ids", help=".npy int [batch, seq]")
  p.add_argument("--inputs", help="multimodal case .npz: token_ids and MaxText model-call arrays (encoder_images, "
                 "encoder_audios, decoder_positions)")
  p.add_argument("--align", type=lambda v: [a for a in v.split(",") if a], default=[],
                 help=f"also run with these alignments ({', '.join(ALIGNMENTS) or 'none defined'}) and save to"
                 " --aligned_output")
  p.add_argument("--aligned_output", help="where the aligned forward's logits go (.npy)")
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


def serve(responses_fd: int) -> int:
  """`--serve=FD`: one case after another in this one process (MaxText's import, about 7 s, paid once), each read
  from standard input as a JSON line {"argv": [...], "log": path}; the case's standard output and error (Python's
  and the native libraries') go to its log, and {"returncode": N} is written as one line to FD when it is done."""
  import traceback  # pylint: disable=import-outside-toplevel

  for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(request["log"], "a", encoding="utf-8") as log:
      os.dup2(log.fileno(), 1)
      os.dup2(log.fileno(), 2)
      try:
        returncode = main(request["argv"])
      except SystemExit as e:
        returncode = e.code if isinstance(e.code, int) else 1
      except Exception:  # pylint: disable=broad-except
        traceback.print_exc()
        returncode = 1
      finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
    os.write(responses_fd, (json.dumps({"returncode": returncode}) + "\n").encode())
  return 0


if __name__ == "__main__":
  if len(sys.argv) == 2 and sys.argv[1].startswith("--serve="):
    sys.exit(serve(int(sys.argv[1].split("=", 1)[1])))
  sys.exit(main())
