"""HF -> MaxText -> HF with the real converter binary, for every tiny model in tools/tiny_models.TINY_MODELS.

Each round trip must give back the original checkpoint: the same tensor names, shapes and dtypes, the same bytes
wherever every transform is exact, and the same logits through transformers. Float32 cells: everything is
bit-identical except query kernels whose 1/sqrt(head_dim) scale MaxText bakes in (llama, mistral, mixtral
targets), which come back within one float32 ulp (measured: ~87% of their elements bit-identical at head_dim 40).

Grid: devices {1, 16} x scan {on, off} x lazy {on, off} for qwen3, qwen3_moe and llama3.1, and devices {1, 16} x
scan {on, off} with lazy on for the other models (lazy only changes how the forward direction reads HF tensors).
Plus bfloat16 cells (bounded to one bf16 ulp where the query is scaled), the Qwen3-30B-A3B structure at reduced
size, vocab padding, one-slice-at-a-time reads, and the ways the reverse direction must fail cleanly.

The forward direction runs the converter binary's conversion (harness.converted: its entry point, in a converter
process reused per device count, one conversion per setting); the reverse direction of the grid cells runs in this
process through `to_huggingface.convert_to_huggingface`, the function the binary's `--direction=to_huggingface`
calls (the binary's own flags, exit codes and messages are checked by the "failing cleanly" tests below, which
still run it as a process). Bazel's shards split the cases by model (harness.GroupShardingLoader), so each shard
builds only its own models.

A round trip cannot see a bug the two directions share (a wrong layout undone by its mirror image); the forward
direction is pinned to transformers' logits by families_test.py.
"""

from __future__ import annotations

import filecmp
import glob
import itertools
import json
import os
import re
import shutil
import subprocess
import sys

from absl.testing import absltest, parameterized

from integration_tests import harness

harness.start_jax()

import numpy as np  # pylint: disable=g-import-not-at-top,g-bad-import-order

from converter import ops  # pylint: disable=g-import-not-at-top
from converter.reverse import reverse_plan, serving_files, to_huggingface  # pylint: disable=g-import-not-at-top
from converter.sources.checkpoint_reader import CheckpointReader  # pylint: disable=g-import-not-at-top
from converter.options import ReverseOptions  # pylint: disable=g-import-not-at-top
from tools import validate_lib  # pylint: disable=g-import-not-at-top
from tools.testing import serving_config, tiny_models
from tools.testing.ulps import spacing, ulps  # pylint: disable=g-import-not-at-top

FULL_GRID_MODELS = ("qwen3", "qwen3_moe", "llama3.1")
QWEN3_30B_A3B = "qwen3_30b_a3b_tiny"  # Has its own test below, by name.
FLOAT32_MAX_LOGITS_DIFF = 1e-4
# bfloat16 query kernels come back within one bf16 ulp (~13% of their elements off by exactly one ulp, see
# ops.DivideInFloat32). The logits of the two bf16 models (computed in float32) then differ by <= 2.5e-3 for the
# dense models (measured), but by up to 0.28 for Mixtral: a one-ulp change can flip a near-tied top-k expert
# choice for a token. So: a max|diff| bound for dense models, cosine and argmax for all.
BFLOAT16_MAX_LOGITS_DIFF_DENSE = 1e-2
BFLOAT16_MIN_COSINE = 0.9999
# bfloat16 cells, one per kind of transform: query scale + RoPE permutation, query scale + experts, all exact;
# every family of the giant MoE wave (latent attention, the gate bias's layer axis, the indexer, fused experts split
# interleaved or in halves, strided blocks): bf16 in, bf16 out, bit for bit.
BFLOAT16_MODELS = ("llama3.1", "mixtral", "qwen3_moe", "deepseek2", "deepseek3", "deepseek3.2", "gpt_oss",
                   "llama4_16e", "llama4_128e", "qwen3_next", "qwen3_5", "olmo3", "gemma4_moe", "gemma4_dense",
                   "gemma4_e2b", "gemma4_e4b")
# The only tensors a family may transform with float arithmetic: query projections (1/sqrt(D) baked in), norm
# scales (Gemma's w + 1) and the embedding (Gemma's sqrt(E), exact when E is a power of 4).
INEXACT_ALLOWED = r"(\.q_proj\.(weight|bias)|norm\.weight|embed_tokens\.weight)$"


def _served(model_dir: str) -> list[str]:
  """The original's files the way back copies besides the weights (converter/reverse/serving_files.py)."""
  return sorted(n for n in os.listdir(model_dir) if serving_files.is_served(n))


def _grid():
  for model in tiny_models.TINY_MODELS:
    if model == QWEN3_30B_A3B or tiny_models.TINY_MODELS[model].fp8:  # FP8 rows: quantized_test's round trips.
      continue
    lazies = (True, False) if model in FULL_GRID_MODELS else (True,)
    # Multimodal rows: their decoders are text rows' (gridded above) and the towers never scan nor change with
    # the device count: one sharded 16-device cell each.
    spec = tiny_models.TINY_MODELS[model]
    devices_of_row, scans = ((16,), spec.scans[-1:]) if spec.inputs else ((1, 16), spec.scans)
    for devices, scan, lazy in itertools.product(devices_of_row, scans, lazies):
      name = f"{model.replace('.', '_')}_devices{devices}_{'scan' if scan else 'noscan'}_{'lazy' if lazy else 'eager'}"
      yield dict(testcase_name=name, model=model, devices=devices, scan=scan, lazy=lazy)


_models: dict[tuple[str, str], tuple[str, np.ndarray]] = {}


def tiny_model(name: str, dtype: str = "float32") -> tuple[str, np.ndarray]:
  """The model's directory and transformers' logits for it (in float32 arithmetic), built once per process."""
  if (name, dtype) not in _models:
    model_dir = tiny_models.build_tiny_model(name, harness.scratch_dir(f"{name}-{dtype}-hf-"), dtype=dtype)
    _models[(name, dtype)] = (model_dir, _logits(model_dir))
  return _models[(name, dtype)]


def _logits(model_dir: str) -> np.ndarray:
  vocab_size = validate_lib.load_model_config(model_dir).vocab_size
  return validate_lib.reference_logits(model_dir, validate_lib.token_ids(vocab_size, 2, 32, 0))


def load_tensors(model_dir: str) -> dict[str, np.ndarray]:
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

  tensors: dict[str, np.ndarray] = {}
  for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
    tensors.update(load_file(path))
  return tensors


_original_tensors: dict[str, dict[str, np.ndarray]] = {}


def original_tensors(model_dir: str) -> dict[str, np.ndarray]:
  if model_dir not in _original_tensors:
    _original_tensors[model_dir] = load_tensors(model_dir)
  return _original_tensors[model_dir]


def to_maxtext(model_dir: str, *flags: str) -> str:
  """The converter binary's conversion (harness.converted: once per setting in this process; read-only)."""
  return harness.converted(model_dir, *flags)


def to_hf(items: str, **options: str) -> str:
  """The reverse conversion, in this process: what `--direction=to_huggingface` runs with the binary's defaults
  (ReverseOptions: 5GB shards, 128 MiB read ahead; one process) and `options` (max_shard_size, hf_config_path),
  without a converter start-up per cell."""
  out = os.path.join(harness.scratch_dir("back-"), "hf")
  to_huggingface.convert_to_huggingface(items, out, ReverseOptions(**options))
  return out


class RoundTripTest(parameterized.TestCase):

  def assert_round_trip(self, original_dir: str, items: str, back_dir: str, **plan_flags) -> dict[str, float]:
    """Names, shapes, dtypes and bytes of `back_dir` against `original_dir`; returns stats of inexact tensors.
    The reverse direction writes the hub's names; the original's other names (transformers' `save_pretrained`
    ones) are compared through the family's aliases."""
    plan = reverse_plan.plan_to_huggingface(items, **plan_flags)
    aliases = [(re.compile(p), r) for p, r in plan.family.tensor_aliases(plan.config)]
    original = {next((p.sub(r, n, count=1) for p, r in aliases if p.match(n)), n): t
                for n, t in original_tensors(original_dir).items()}
    back = load_tensors(back_dir)
    self.assertEqual(sorted(back), sorted(original))
    inexact = {t.name: t.pieces[0][0].ops for t in plan.tensors if not t.exact}
    for name in inexact:
      self.assertRegex(name, INEXACT_ALLOWED)
    worst_ulps, identical, elements = 0.0, 0, 0
    for name, reference in original.items():
      value = back[name]
      self.assertEqual((value.dtype, value.shape), (reference.dtype, reference.shape), name)
      if name not in inexact:
        self.assertEqual(value.tobytes(), reference.tobytes(), f"{name} is not bit-identical")
        continue
      # A float32 scale undone by dividing by the same float32 factor: within one ulp (ops.DivideInFloat32), in
      # float32 and in bfloat16. An offset (x + 1 - 1): within one ulp of |x| + 1 instead.
      wide = reference.astype(np.float32)
      offset = sum(abs(op.offset) for op in inexact[name] if isinstance(op, ops.AddInFloat32))
      bound = spacing(wide, reference.dtype) + (spacing(np.abs(wide) + offset, reference.dtype) if offset else 0.0)
      excess = np.abs(value.astype(np.float32) - wide) - bound
      self.assertLessEqual(float(excess.max()), 0.0, f"{name}: off by more than the bound")
      error = ulps(value, reference)
      worst_ulps = max(worst_ulps, float(error.max()))
      identical += int(np.sum(value.astype(np.float32) == reference.astype(np.float32)))
      elements += value.size
    return {"inexact_tensors": len(inexact), "max_ulps": worst_ulps,
            "bit_identical_fraction": identical / elements if elements else 1.0}

  def assert_config(self, original_dir: str, back_dir: str, dtype: str) -> None:
    """config.json is the original's with its dtype set (`torch_dtype` too where the original has one), and what
    vLLM's config loading reads from it is the original's (tools/testing/serving_config.py)."""
    with open(os.path.join(original_dir, "config.json")) as f:
      original = json.load(f)
    with open(os.path.join(back_dir, "config.json")) as f:
      back = json.load(f)
    self.assertEqual(serving_config.problems(back, original, dtype, files=os.listdir(back_dir)), [])
    self.assertEqual(back.pop("dtype"), dtype)
    self.assertEqual(back.pop("torch_dtype", None), dtype if "torch_dtype" in original else None)
    original.pop("dtype", None)
    original.pop("torch_dtype", None)
    self.assertEqual(back, original)

  def assert_layout(self, model_dir: str, back_dir: str, sharded: bool) -> None:
    """The weights in one file or named shards with their index, config.json, and the original's serving files
    (converter/reverse/serving_files.py; save_pretrained writes generation_config.json) byte for byte."""
    served = _served(model_dir)
    for name in served:
      self.assertTrue(filecmp.cmp(os.path.join(model_dir, name), os.path.join(back_dir, name), shallow=False), name)
    files = sorted(set(os.listdir(back_dir)) - set(served))
    if not sharded:
      self.assertEqual(files, ["config.json", "model.safetensors"])
      return
    shards = [f for f in files if f.endswith(".safetensors")]
    self.assertGreater(len(shards), 1)
    self.assertEqual(shards, [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)])
    with open(os.path.join(back_dir, "model.safetensors.index.json")) as f:
      index = json.load(f)
    tensors = load_tensors(back_dir)
    self.assertEqual(index["metadata"]["total_size"], sum(t.nbytes for t in tensors.values()))
    self.assertEqual(sorted(index["weight_map"]), sorted(tensors))
    from safetensors import safe_open  # pylint: disable=g-import-not-at-top

    for shard in shards:
      with safe_open(os.path.join(back_dir, shard), "np") as f:
        self.assertTrue(all(index["weight_map"][name] == shard for name in f.keys()))
    self.assertEqual(os.listdir(os.path.dirname(back_dir)), ["hf"])  # No staging directory left behind.

  @parameterized.named_parameters(*_grid())
  def test_float32_round_trip(self, model, devices, scan, lazy):
    model_dir, reference = tiny_model(model)
    items = to_maxtext(model_dir, "--save_dtype=float32", f"--simulated_cpu_devices_count={devices}",
                       f"--scan_layers={scan}", f"--lazy_load_tensors={lazy}")
    sharded = devices == 16  # 16-device cells also exercise --max_shard_size (several shards + index).
    back = to_hf(items, **({"max_shard_size": "1MB"} if sharded else {}))
    stats = self.assert_round_trip(model_dir, items, back)
    self.assert_config(model_dir, back, "float32")
    self.assert_layout(model_dir, back, sharded)
    diff = float(np.max(np.abs(_logits(back) - reference)))
    print(f"{self._testMethodName}: logits max|diff| {diff:.3g}, {stats}", file=sys.stderr)
    self.assertLessEqual(diff, FLOAT32_MAX_LOGITS_DIFF)

  @parameterized.named_parameters(*[dict(testcase_name=m.replace(".", "_"), model=m) for m in BFLOAT16_MODELS])
  def test_bfloat16_round_trip(self, model):
    model_dir, reference = tiny_model(model, "bfloat16")
    items = to_maxtext(model_dir, "--save_dtype=bfloat16", "--simulated_cpu_devices_count=16",
                       f"--scan_layers={tiny_models.TINY_MODELS[model].scans[0]}")
    back = to_hf(items)
    stats = self.assert_round_trip(model_dir, items, back)
    self.assert_config(model_dir, back, "bfloat16")
    diff, cosine, agreement = validate_lib.compare_logits(_logits(back), reference)
    print(f"{self._testMethodName}: logits max|diff| {diff:.3g} cosine {cosine:.8f}, {stats}", file=sys.stderr)
    if not stats["inexact_tensors"]:
      self.assertEqual(diff, 0.0)
      return
    plan = reverse_plan.plan_to_huggingface(items)
    if not plan.family.runtime(plan.config, plan.target_model).decoder.routing:
      self.assertLessEqual(diff, BFLOAT16_MAX_LOGITS_DIFF_DENSE)
    self.assertGreaterEqual(cosine, BFLOAT16_MIN_COSINE)
    self.assertEqual(agreement, 1.0)

  @parameterized.named_parameters(
      *[dict(testcase_name=f"devices{d}_{'scan' if s else 'noscan'}", devices=d, scan=s)
        for d, s in itertools.product((1, 16), (True, False))])
  def test_qwen3_30b_a3b_roundtrip_conversion(self, devices, scan):
    model_dir, reference = tiny_model(QWEN3_30B_A3B)
    items = to_maxtext(model_dir, "--save_dtype=float32", f"--simulated_cpu_devices_count={devices}",
                       f"--scan_layers={scan}")
    # The MaxText side has the 30B-A3B layout: experts first, then (scanned) layers.
    arrays = {"/".join(k[2:]): a.shape for k, a in CheckpointReader(items).arrays.items()}
    if scan:
      self.assertEqual(arrays["decoder/layers/moe_block/wi_0"], (8, 4, 128, 48))
      self.assertEqual(arrays["decoder/layers/moe_block/wo"], (8, 4, 48, 128))
      self.assertEqual(arrays["decoder/layers/self_attention/query/kernel"], (128, 4, 8, 32))
    else:
      self.assertEqual(arrays["decoder/layers_3/moe_block/wi_1"], (8, 128, 48))
      self.assertEqual(arrays["decoder/layers_3/moe_block/gate/kernel"], (128, 8))
    back = to_hf(items, max_shard_size="500KB")
    stats = self.assert_round_trip(model_dir, items, back)
    self.assertEqual(stats["inexact_tensors"], 0)  # Qwen3 scales queries at run time: everything bit-identical.
    self.assert_config(model_dir, back, "float32")
    self.assert_layout(model_dir, back, sharded=True)
    diff = float(np.max(np.abs(_logits(back) - reference)))
    self.assertLessEqual(diff, FLOAT32_MAX_LOGITS_DIFF)
    self.assertEqual(diff, 0.0)  # Same bytes, same program: the logits are identical, not just close.

  def test_padded_vocab_is_cropped_back(self):
    # llama3 is untied: the embedding is padded by rows (PadRows), the logits kernel by columns (PadColumns).
    model_dir, reference = tiny_model("llama3")
    items = to_maxtext(model_dir, "--save_dtype=float32", "--simulated_cpu_devices_count=1", "--target_vocab_size=512")
    arrays = {"/".join(k[2:]): a.shape for k, a in CheckpointReader(items).arrays.items()}
    self.assertEqual((arrays["token_embedder/embedding"], arrays["decoder/logits_dense/kernel"]), ((512, 192), (192, 512)))
    back = to_hf(items)
    self.assert_round_trip(model_dir, items, back)
    self.assertLessEqual(float(np.max(np.abs(_logits(back) - reference))), FLOAT32_MAX_LOGITS_DIFF)

  def test_reads_one_slice_at_a_time(self):
    from unittest import mock  # pylint: disable=g-import-not-at-top

    from converter.sources import checkpoint_reader  # pylint: disable=g-import-not-at-top

    model_dir, _ = tiny_model("qwen3_moe")
    items = to_maxtext(model_dir, "--save_dtype=float32", "--simulated_cpu_devices_count=16")
    reads = []
    real_read = checkpoint_reader.OpenArray.read

    def recording_read(self_, index):
      value = real_read(self_, index)
      reads.append(("/".join(self_.array.path), value.nbytes, self_.array.nbytes))
      return value

    out = os.path.join(harness.scratch_dir("inprocess-"), "hf")
    with mock.patch.object(checkpoint_reader.OpenArray, "read", recording_read):
      result = to_huggingface.convert_to_huggingface(items, out, ReverseOptions(max_shard_size="1MB"))
    self.assertEqual(len(reads), result.num_tensors)  # One read per HF tensor, none of a whole stacked leaf.
    for leaf, read_bytes, leaf_bytes in reads:
      if "/layers/" in leaf:
        self.assertLessEqual(read_bytes * 4, leaf_bytes, leaf)  # 4 layers (x 6 experts) per stacked leaf.
    self.assertEqual(load_tensors(out).keys(), original_tensors(model_dir).keys())

  @parameterized.parameters(
      ("llama3", "--target_vocab_size=512", "--simulated_cpu_devices_count=16", "--scan_layers=true"),
      ("qwen3_moe", "--simulated_cpu_devices_count=1", "--scan_layers=false"),
      ("deepseek3", "--simulated_cpu_devices_count=16", "--scan_layers=true"))
  def test_large_tensors_come_back_a_slab_of_rows_at_a_time(self, model, *flags):
    from unittest import mock  # pylint: disable=g-import-not-at-top

    from converter.sources import checkpoint_reader  # pylint: disable=g-import-not-at-top

    model_dir, _ = tiny_model(model)
    items = to_maxtext(model_dir, "--save_dtype=float32", *flags)
    whole = os.path.join(harness.scratch_dir("inprocess-"), "hf")
    to_huggingface.convert_to_huggingface(items, whole, ReverseOptions(max_shard_size="1MB"))
    reads = []
    real_read = checkpoint_reader.OpenArray.read

    def recording_read(self_, index):
      value = real_read(self_, index)
      reads.append(("/".join(self_.array.path[2:]), value.nbytes))
      return value

    sliced = os.path.join(harness.scratch_dir("inprocess-"), "hf")
    with mock.patch.object(reverse_plan, "ROW_BLOCK_BYTES", 4096), \
         mock.patch.object(checkpoint_reader.OpenArray, "read", recording_read):
      to_huggingface.convert_to_huggingface(items, sliced, ReverseOptions(max_shard_size="1MB"))
    self.assertEqual(sorted(os.listdir(sliced)), sorted(os.listdir(whole)))
    for name in os.listdir(whole):
      with open(os.path.join(sliced, name), "rb") as a, open(os.path.join(whole, name), "rb") as b:
        self.assertEqual(a.read(), b.read(), name)
    embedding = [n for leaf, n in reads if leaf == "token_embedder/embedding"]
    self.assertGreater(len(embedding), 8)
    self.assertLessEqual(max(embedding), 4096)
    queries = [n for leaf, n in reads if leaf.endswith(("query/kernel", "wq_b/kernel"))]
    query_bytes = [a.nbytes for name, a in load_tensors(whole).items()
                   if name.endswith(("q_proj.weight", "q_b_proj.weight"))]
    self.assertLessEqual(max(queries) * 2, min(query_bytes))  # Whole heads at a time, not the whole projection.

  # --- failing cleanly ------------------------------------------------------------------------------------------

  _converted_qwen3: str | None = None

  def checkpoint_copy(self) -> str:
    """A private copy of one converted qwen3 checkpoint (its metadata or data can then be damaged)."""
    if RoundTripTest._converted_qwen3 is None:
      model_dir, _ = tiny_model("qwen3")
      RoundTripTest._converted_qwen3 = to_maxtext(model_dir, "--save_dtype=float32", "--simulated_cpu_devices_count=1")
    copy = os.path.join(harness.scratch_dir("copy-"), "ckpt")
    shutil.copytree(os.path.dirname(os.path.dirname(RoundTripTest._converted_qwen3)), copy)
    return os.path.join(copy, "0", "items")

  def assert_fails_leaving_nothing(self, items: str, *flags: str, expect: tuple[str, ...]) -> str:
    parent = harness.scratch_dir("failed-")
    out = os.path.join(parent, "hf")
    result = harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={items}",
                                   f"--output_dir={out}", *flags, check=False)
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    for text in expect:
      self.assertIn(text, result.stderr)
    self.assertEqual(os.listdir(parent), [])  # Neither the output nor a staging directory.
    return result.stderr

  def test_checkpoint_without_hf_config_needs_hf_config_path(self):
    model_dir, reference = tiny_model("qwen3")
    items = self.checkpoint_copy()
    metadata_path = os.path.join(os.path.dirname(items), "_CHECKPOINT_METADATA")
    with open(metadata_path) as f:
      metadata = json.load(f)
    del metadata["custom_metadata"]["hf2maxtext"]["hf_config"]
    with open(metadata_path, "w") as f:
      json.dump(metadata, f)
    self.assert_fails_leaving_nothing(items, expect=("--hf_config_path", "_CHECKPOINT_METADATA"))
    back = to_hf(items, hf_config_path=f"{model_dir}/config.json")
    self.assert_round_trip(model_dir, items, back, hf_config_path=f"{model_dir}/config.json")
    self.assertLessEqual(float(np.max(np.abs(_logits(back) - reference))), FLOAT32_MAX_LOGITS_DIFF)

  def test_damaged_chunk_fails_naming_the_leaf(self):
    import tensorstore as ts  # pylint: disable=g-import-not-at-top

    items = self.checkpoint_copy()
    store = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{items}/"}).result()
    chunk = next(k for k in store.list().result() if k.startswith(b"params.params.decoder.layers.mlp.wo.kernel/c/"))
    store.write(chunk, b"not a chunk").result()  # Fails its checksum when read; every other leaf is intact.
    stderr = self.assert_fails_leaving_nothing(items, expect=("leaf params/params/decoder/layers/mlp/wo/kernel",))
    self.assertIn("failed", stderr)

  def test_wrong_family_is_refused(self):
    items = self.checkpoint_copy()
    self.assert_fails_leaving_nothing(items, "--family=llama", expect=("Qwen3ForCausalLM", "llama"))

  def test_existing_output_needs_overwrite(self):
    model_dir, _ = tiny_model("qwen3")
    items = self.checkpoint_copy()
    out = os.path.join(harness.scratch_dir("existing-"), "hf")
    os.makedirs(out)
    with open(os.path.join(out, "keep.txt"), "w") as f:
      f.write("x")
    result = harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={items}", f"--output_dir={out}",
                                   check=False)
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertIn("--overwrite", result.stderr)
    self.assertEqual(os.listdir(out), ["keep.txt"])
    # One process never loads JAX or Orbax (about 0.9 CPU-s of start-up): the checkpoint is read through
    # TensorStore with Orbax's read spec (converter/sources/orbax_format.py). The import log shows every module loaded.
    result = subprocess.run(
        harness.converter_command("--direction=to_huggingface", f"--checkpoint_path={items}", f"--output_dir={out}",
                                  "--overwrite"),
        env={**harness.converter_env(), "PYTHONPROFILEIMPORTTIME": "1"}, capture_output=True, text=True, timeout=900)
    self.assertEqual(result.returncode, 0, result.stderr[-4000:])
    imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")]
    self.assertIn("tensorstore", imported)
    self.assertEqual([m for m in imported if m.split(".")[0] in ("jax", "jaxlib", "orbax")], [])
    self.assertEqual(sorted(os.listdir(out)), sorted(["config.json", "model.safetensors", *_served(model_dir)]))
    self.assertEqual(sorted(load_tensors(out)), sorted(load_tensors(model_dir)))

  def test_direction_flags_are_validated(self):
    result = harness.run_converter("--direction=to_huggingface", "--output_dir=/tmp/unused", check=False)
    self.assertNotEqual(result.returncode, 0)
    self.assertIn("--checkpoint_path", result.stderr)
    result = harness.run_converter("--output_dir=/tmp/unused", check=False)
    self.assertNotEqual(result.returncode, 0)
    self.assertIn("--hf_model_path", result.stderr)

  def test_the_budget_flag_applies_to_the_reverse_direction_and_forward_only_flags_are_refused(self):
    items = self.checkpoint_copy()
    outputs = []
    for flags in ((), ("--max_inflight_bytes=4096",)):
      outputs.append(os.path.join(harness.scratch_dir("budget-"), "hf"))
      harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={items}", f"--output_dir={outputs[-1]}",
                            *flags)
    for name in os.listdir(outputs[0]):
      with open(os.path.join(outputs[0], name), "rb") as a, open(os.path.join(outputs[1], name), "rb") as b:
        self.assertEqual(a.read(), b.read(), name)
    result = harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={items}",
                                   f"--output_dir={outputs[0]}-x", "--resume", "--scan_layers=false", check=False)
    self.assertNotEqual(result.returncode, 0)
    self.assertIn("--scan_layers, --resume apply to --direction=to_maxtext only", result.stderr)


# The cases that share a tiny model run in one shard (each model built once): the grid cells by the model in their
# name, the named tests by the model they read.
SHARD_GROUPS = harness.model_group(
    r"test_(?:(?:float32|bfloat16)_round_trip_(.+?)(?:_devices\d+_.*)?|(qwen3_30b_a3b)_roundtrip_conversion_.*)$",
    {"test_padded_vocab_is_cropped_back": "llama3", "test_reads_one_slice_at_a_time": "qwen3_moe",
     "test_large_tensors_come_back_a_slab_of_rows_at_a_time0": "llama3",
     "test_large_tensors_come_back_a_slab_of_rows_at_a_time1": "qwen3_moe",
     "test_large_tensors_come_back_a_slab_of_rows_at_a_time2": "deepseek3",
     **{name: "qwen3" for name in ("test_checkpoint_without_hf_config_needs_hf_config_path",
                                   "test_damaged_chunk_fails_naming_the_leaf", "test_wrong_family_is_refused",
                                   "test_existing_output_needs_overwrite",
                                   "test_the_budget_flag_applies_to_the_reverse_direction_and_forward_only_flags_are_refused")}})

if __name__ == "__main__":
  absltest.main(testLoader=harness.GroupShardingLoader(SHARD_GROUPS))
