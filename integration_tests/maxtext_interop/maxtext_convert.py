"""MaxText 0.2.5's own converter (`maxtext.checkpoint_conversion.to_maxtext`) on a local HF checkpoint, unchanged.

Runs under the MaxText venv (.mtvenv, Python 3.12, no torch); tools/restore_benchmark.py uses it for its
"MaxText `to_maxtext`" row:

  .mtvenv/bin/python integration_tests/maxtext_interop/maxtext_convert.py --hf_model_path=HF_DIR \
      --model_name=llama3.1-8b --overrides=@overrides.json --output_dir=OUT --overwrite
  # then, untimed: OUT's stored tree (leaf paths, shapes, dtypes) against our conversion of the same weights
  .mtvenv/bin/python integration_tests/maxtext_interop/maxtext_convert.py --noconvert --output_dir=OUT \
      --compare_with=OURS/0/items

The converter runs as `python -m maxtext.checkpoint_conversion.to_maxtext` would (its own `__main__`: its argument
parsing, its JAX settings, its `main`), with its defaults `--lazy_load_tensors=True`
`--simulated_cpu_devices_count=16` `--save_dtype=bfloat16` passed explicitly, and MaxText's `key=value` config
arguments: `model_name`; `override_model_config=true` (MaxText refuses to change a named model's dims
without it); `skip_jax_distributed_system=true` (one process: with the default hardware setting, pyconfig
otherwise calls `jax.distributed.initialize()`, which fails without a coordinator); the --overrides (dims, norms,
RoPE, `scan_layers`: what our conversion record gives MaxText to load the same model); `base_output_directory`
(where it writes: OUT/0/items) and `run_name`. Two shims, both needed only because these are local synthetic
weights read without torch, each as small as it can be:

1. `HF_MODEL_CONFIGS[model_name]` := the checkpoint's own config.json. `to_maxtext` builds its name mapping and
   reshape hooks from the HF config of the *published* model it knows by name (`HF_MODEL_CONFIGS`, e.g. 32 layers
   of hidden 4096 for llama3.1-8b), never from the local config.json: with a smaller model of the same family it
   maps layers and experts that do not exist. The MaxText side (the tree it fills) comes from the config
   arguments, as it would for a real user.
2. `safetensors.safe_open(..., framework="np")` reads BF16 (and F8_E4M3) tensors. Without torch, `to_maxtext`'s
   lazy loader opens shards with `framework="np"` (`LazyHFLoader.get_tensor`), and safetensors' numpy path fails on
   BF16 ("data type 'bfloat16' not understood"): numpy has no bfloat16. The shim parses the safetensors header
   and views the tensor's bytes as the `ml_dtypes` type, the array that `to_maxtext` would have got through torch
   (`tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)`). Every other framework goes to the real
   `safe_open`.

Fails loudly: an existing --output_dir without --overwrite, a converter that exits without writing
OUT/0/items and OUT/0/_CHECKPOINT_METADATA (the output directory is empty or emptied first: `to_maxtext` saves
step 0 through a checkpoint manager, and a step already there must not pass for a new conversion), a tensor of
a dtype the shim does not know, and in --compare_with mode any leaf that differs from ours (printed, exit 3).
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import struct
import sys
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("hf_model_path", None, "Local HF checkpoint directory (config.json, *.safetensors).")
flags.DEFINE_string("model_name", None, "MaxText model name, e.g. llama3.1-8b or qwen3-30b-a3b.")
flags.DEFINE_string("overrides", None, "MaxText config overrides, a JSON object or @file.json (our record's "
                    "maxtext_overrides); passed as key=value arguments.")
flags.DEFINE_string("output_dir", None, "Where the converter writes (OUT/0/items).", required=True)
flags.DEFINE_bool("overwrite", False, "Empty --output_dir first if it exists.")
flags.DEFINE_bool("convert", True, "Run the conversion (--noconvert: only --compare_with an existing output).")
flags.DEFINE_string("compare_with", None, "After converting (or alone with --noconvert): compare OUT/0/items' "
                    "stored leaves (paths under params/params, shapes, dtypes) with this checkpoint's items.")

_NUMPY_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "I64": "int64", "I32": "int32",
                 "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


class _NumpySafetensors:
  """The part of `safe_open(path, framework="np")` that `to_maxtext` uses, for every dtype in the file."""

  def __init__(self, path: str):
    self._path = path
    with open(path, "rb") as f:
      (size,) = struct.unpack("<Q", f.read(8))
      self._header = json.loads(f.read(size))
    self._data_start = 8 + size

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False

  def keys(self):
    return [k for k in self._header if k != "__metadata__"]

  def metadata(self):
    return self._header.get("__metadata__")

  def get_tensor(self, key: str):
    import ml_dtypes  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel

    entry = self._header[key]
    kind = entry["dtype"]
    dtype = {"BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn}.get(kind) or _NUMPY_DTYPES.get(kind)
    if dtype is None:
      raise TypeError(f"{self._path}: tensor {key} has dtype {kind}, which this reader does not know")
    begin, end = entry["data_offsets"]
    count = (end - begin) // np.dtype(dtype).itemsize
    array = np.fromfile(self._path, dtype=dtype, count=count, offset=self._data_start + begin)
    if array.nbytes != end - begin:
      raise ValueError(f"{self._path}: tensor {key} is truncated")
    return array.reshape(entry["shape"])


def _install_shims(hf_model_path: str, model_name: str) -> None:
  import safetensors  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from maxtext.checkpoint_conversion.utils import hf_model_configs  # pylint: disable=import-outside-toplevel

  # 1. The HF config of these weights, not of the published model of that name.
  if model_name not in hf_model_configs.HF_MODEL_CONFIGS:
    raise SystemExit(f"MaxText's to_maxtext knows no HF config for {model_name}")
  hf_model_configs.HF_MODEL_CONFIGS[model_name] = transformers.AutoConfig.from_pretrained(hf_model_path)

  # 2. BF16 safetensors through the numpy framework (to_maxtext does `from safetensors import safe_open` when
  # run below, so it picks this up).
  real_safe_open = safetensors.safe_open

  def safe_open(path, framework, device="cpu"):
    if framework in ("np", "numpy"):
      return _NumpySafetensors(str(path))
    return real_safe_open(path, framework=framework, device=device)

  safetensors.safe_open = safe_open


def _config_arguments(overrides: dict) -> list[str]:
  out = []
  for key, value in overrides.items():
    if isinstance(value, (dict, list)) or value is None:
      raise SystemExit(f"override {key}={value!r}: only scalars can be passed as key=value")
    out.append(f"{key}={json.dumps(value) if isinstance(value, bool) else value}")
  return out


def _convert() -> None:
  from maxtext.configs import pyconfig  # pylint: disable=import-outside-toplevel

  hf_model_path, out = os.path.abspath(FLAGS.hf_model_path), os.path.abspath(FLAGS.output_dir)
  if os.path.exists(out) and os.listdir(out):
    if not FLAGS.overwrite:
      raise SystemExit(f"{out} exists and is not empty (pass --overwrite)")
    shutil.rmtree(out)
  overrides = {}
  if FLAGS.overrides:
    text = FLAGS.overrides
    if text.startswith("@"):
      with open(text[1:], encoding="utf-8") as f:
        text = f.read()
    overrides = json.loads(text)
  _install_shims(hf_model_path, FLAGS.model_name)
  base_yml = os.path.join(os.path.dirname(pyconfig.__file__), "base.yml")
  sys.argv = ["to_maxtext", base_yml, f"--hf_model_path={hf_model_path}", "--lazy_load_tensors=True",
              "--simulated_cpu_devices_count=16", "--save_dtype=bfloat16", f"model_name={FLAGS.model_name}",
              "override_model_config=true", "skip_jax_distributed_system=true", *_config_arguments(overrides),
              f"base_output_directory={out}", "run_name=maxtext_convert"]
  print("to_maxtext", " ".join(sys.argv[1:]), flush=True)
  start = time.monotonic()
  runpy.run_module("maxtext.checkpoint_conversion.to_maxtext", run_name="__main__", alter_sys=True)
  for needed in ("0/items", "0/_CHECKPOINT_METADATA"):
    if not os.path.exists(os.path.join(out, needed)):
      raise SystemExit(f"to_maxtext finished without writing {os.path.join(out, needed)}")
  print(json.dumps({"converted": os.path.join(out, "0", "items"), "seconds": time.monotonic() - start}), flush=True)


def _compare(items: str, ours: str) -> int:
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import maxtext_logits  # pylint: disable=import-outside-toplevel

  theirs_tree, theirs_elsewhere = maxtext_logits.checkpoint_tree(items)
  ours_tree, ours_elsewhere = maxtext_logits.checkpoint_tree(ours)
  # compare_trees speaks of "maxtext" (the first) and "checkpoint" (the second): here ours and to_maxtext's.
  problems = [p.replace("maxtext=", "ours=").replace("checkpoint=", "to_maxtext=").replace(
      "missing in checkpoint", "missing in to_maxtext's").replace("extra in checkpoint (MaxText ignores it)",
                                                                  "only in to_maxtext's")
              for p in maxtext_logits.compare_trees(ours_tree, theirs_tree)]
  problems += [f"outside params/params, only in one: {k}" for k in sorted(set(theirs_elsewhere) ^ set(ours_elsewhere))]
  for problem in problems:
    print("TREE MISMATCH:", problem, flush=True)
  print(json.dumps({"compared": items, "with": ours, "leaves": len(ours_tree), "mismatches": len(problems)}),
        flush=True)
  return 3 if problems else 0


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if FLAGS.convert:
    if not FLAGS.hf_model_path or not FLAGS.model_name:
      raise app.UsageError("--hf_model_path and --model_name are required to convert")
    _convert()
  if FLAGS.compare_with:
    return _compare(os.path.join(os.path.abspath(FLAGS.output_dir), "0", "items"), FLAGS.compare_with)
  return 0


if __name__ == "__main__":
  app.run(main)
