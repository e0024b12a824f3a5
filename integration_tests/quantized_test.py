"""Checkpoints as DeepSeek, GPT-OSS and Qwen3.5 ship them, quantized by the test itself, converted directly.

A tiny DeepSeek V3 gets FP8 block scales of 48x40 values (non-square, with partial last blocks on both axes of
most weights: 192 / 40, 64 / 40, 256 / 48 ...), a tiny GPT-OSS gets MXFP4 experts, a tiny Qwen3.5 FP8 blocks of
32x32 with BF16 scales (tools/testing/tiny_models.py `qwen3_5_fp8`). Each conversion must equal, bit for bit, the
conversion of the same weights dequantized by an independent numpy reference (tools/quantize.py) and saved as
plain float32; its logits must match transformers run on those dequantized weights; Kimi K2-Thinking and K2.5
ship their routed experts INT4 in compressed-tensors' format (written by compressed-tensors itself); `--dry_run`
names the storage formats; the reverse direction gives back the dequantized weights; and a quantized checkpoint the
converter cannot read is refused with the tensor and the reason. `--keep_fp8` (MaxText's native fp8 model) must give
FP8 kernels whose MaxText dequantization is the dequantized conversion, bit for bit, and refuse what MaxText's fp8
tree cannot hold.
"""

from __future__ import annotations

import itertools
import json
import os

from absl.testing import absltest, parameterized

from integration_tests import harness

harness.start_jax()

import ml_dtypes  # pylint: disable=g-import-not-at-top,g-bad-import-order
import numpy as np  # pylint: disable=g-import-not-at-top,g-bad-import-order
from safetensors import safe_open  # pylint: disable=g-import-not-at-top
from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

from converter.layout import layout_inspection  # pylint: disable=g-import-not-at-top
from converter.sources.checkpoint_reader import CheckpointReader  # pylint: disable=g-import-not-at-top
from converter.checkpoint_format.record import ConversionRecord  # pylint: disable=g-import-not-at-top
from tools import checkpoint_io, quantize, validate_lib  # pylint: disable=g-import-not-at-top
from tools.testing import tiny_models
from tools import synthetic_checkpoint  # pylint: disable=g-import-not-at-top
from tools.testing import serving_config  # pylint: disable=g-import-not-at-top
from tools.safetensors_writer import write_safetensors  # pylint: disable=g-import-not-at-top

FP8_BLOCK = (48, 40)
THRESHOLDS = validate_lib.Thresholds()  # The float32 bar (its defaults).
FORMATS = ("fp8", "mxfp4", "qwen3_5_fp8")
CELLS = [dict(testcase_name=f"{fmt}_devices{d}_{'scan' if s else 'noscan'}", fmt=fmt, devices=d, scan=s)
         for fmt, d, s in itertools.product(FORMATS, (1, 16), (True, False))]

_models: dict[str, tuple[str, str, np.ndarray]] = {}


def quantized_model(fmt: str) -> tuple[str, str, np.ndarray]:
  """(quantized checkpoint, its numpy dequantization in float32, transformers' logits on the latter)."""
  if fmt not in _models:
    if fmt in tiny_models.TINY_MODELS:  # Shipped quantized by its row (qwen3_5_fp8, deepseek4_fp8).
      quantized = tiny_models.build_tiny_model(fmt, harness.scratch_dir(f"{fmt}-"))
    else:
      base = tiny_models.build_tiny_model("deepseek3" if fmt == "fp8" else "gpt_oss",
                                          harness.scratch_dir(f"{fmt}-hf-"))
      if fmt == "fp8":
        quantized = quantize.quantize_fp8(base, harness.scratch_dir("fp8-"), FP8_BLOCK)
      else:
        quantized = quantize.quantize_mxfp4(base, harness.scratch_dir("mxfp4-"))
    reference = quantize.dequantize(quantized, harness.scratch_dir(f"{fmt}-dequantized-"))
    config = validate_lib.load_model_config(reference)
    logits = validate_lib.reference_logits(reference, validate_lib.token_ids(config.vocab_size, 2, 32, 0))
    _models[fmt] = (quantized, reference, logits)
  return _models[fmt]


def _serving_problems(original_dir: str, back_dir: str) -> list[str]:
  """What vLLM's config loading would reject or misread in the way back's config.json (tools/testing/serving_config.py),
  against the quantized original's: its quantization_config must be gone, the rest read as the original's, and
  its dtype the one vLLM reads from the written tensors (some rows keep float32 tensors beside bfloat16 ones)."""
  configs = []
  for directory in (back_dir, original_dir):
    with open(os.path.join(directory, "config.json")) as f:
      configs.append(json.load(f))
  dtypes = []
  for name in os.listdir(back_dir):
    if name.endswith(".safetensors"):
      with safe_open(os.path.join(back_dir, name), "np") as f:
        dtypes += [f.get_slice(key).get_dtype() for key in f.keys()]
  return serving_config.problems(*configs, serving_config.weights_dtype(dtypes), files=os.listdir(back_dir))


def convert(model_dir: str, *flags: str) -> str:
  """The converter binary's conversion (harness.converted: once per setting in this process; read-only)."""
  return harness.converted(model_dir, *flags)


class QuantizedTest(parameterized.TestCase):

  @parameterized.named_parameters(*CELLS)
  def test_logits_match_transformers_on_the_dequantized_weights(self, fmt, devices, scan):
    quantized, reference_dir, reference = quantized_model(fmt)
    items = convert(quantized, "--save_dtype=float32", f"--simulated_cpu_devices_count={devices}",
                    f"--scan_layers={scan}")
    report = validate_lib.validate(reference_dir, items, reference=reference)
    self.assertEqual(report.failures(THRESHOLDS), [], report)
    self.assertEqual(ConversionRecord.read(items).quant_method, fmt.rsplit("_", 1)[-1])

  @parameterized.product(fmt=FORMATS, save_dtype=("float32", "bfloat16"))
  def test_every_leaf_equals_the_numpy_dequantization(self, fmt, save_dtype):
    # Dequantized in float32 and rounded once to the save dtype: the same bytes as converting the float32
    # reference, whatever the blocks, partial ones included.
    quantized, reference_dir, _ = quantized_model(fmt)
    flags = (f"--save_dtype={save_dtype}", "--simulated_cpu_devices_count=1")
    ours, expected = convert(quantized, *flags), convert(reference_dir, *flags)
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(ours),
                                                       checkpoint_io.restore_v0(expected)), [])
    # Dequantized weights take few distinct values: stored at zstd level 3, the float reference at 1.
    self.assertEqual(_zstd_levels(ours), {3})
    self.assertEqual(_zstd_levels(expected), {1})

  def test_fp8_blocks_are_taken_from_the_config_not_the_shapes(self):
    # A 256-row weight in 48-row blocks has 6 scale rows; inferring the block from the shapes gives 42 rows
    # (256 // 6) and shifts every block after the first: the values must be the config's blocks.
    quantized, _, _ = quantized_model("fp8")
    stored = quantize.load_tensors(quantized)
    name = "model.layers.0.mlp.gate_proj.weight"
    self.assertEqual(stored[name + "_scale_inv"].shape, (6, 5))
    kernel = checkpoint_io.restore_v0(convert(quantized, "--save_dtype=float32", "--simulated_cpu_devices_count=1",
                                              "--scan_layers=false"))["params"]["params"]["decoder"]
    kernel = kernel["dense_layers_0"]["mlp"]["wi_0"]["kernel"]
    expected = quantize.fp8_dequantize(stored[name], stored[name + "_scale_inv"], FP8_BLOCK).T
    np.testing.assert_array_equal(kernel, expected)

  def test_dry_run_shows_each_source_format(self):
    for fmt, expected in (("fp8", "F8_E4M3 x F32 scales, 48x40 blocks"), ("mxfp4", "MXFP4 (U8 e2m1 blocks")):
      quantized, _, _ = quantized_model(fmt)
      out = os.path.join(harness.scratch_dir("dry-"), "out")
      result = harness.run_converter(f"--hf_model_path={quantized}", f"--output_dir={out}", "--dry_run")
      self.assertIn(expected, result.stdout)
      self.assertIn(f"{fmt} weights dequantized while streaming", result.stdout)
      self.assertFalse(os.path.exists(out))

  @parameterized.parameters(("fp8",), ("mxfp4",), ("qwen3_5_fp8", "--keep_fp8"), ("deepseek4_fp8",))
  def test_back_to_huggingface_gives_the_dequantized_weights(self, fmt, *flags):
    quantized, reference_dir, _ = quantized_model(fmt)
    items = convert(quantized, "--save_dtype=bfloat16", "--simulated_cpu_devices_count=1", *flags)
    back = os.path.join(harness.scratch_dir("back-"), "hf")
    result = harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={items}", f"--output_dir={back}")
    self.assertIn("come back dequantized", result.stderr + result.stdout)
    tensors = load_file(os.path.join(back, "model.safetensors"))
    expected = load_file(os.path.join(reference_dir, "model.safetensors"))
    self.assertEqual(sorted(tensors), sorted(expected))
    for name, value in expected.items():
      self.assertEqual(tensors[name].tobytes(), value.astype(tensors[name].dtype).tobytes(), name)
    with open(os.path.join(back, "config.json")) as f:
      written = json.load(f)
    self.assertNotIn("quantization_config", written)
    self.assertNotIn("expert_dtype", written)  # DeepSeek V4's, part of its quantization.
    self.assertEqual(_serving_problems(quantized, back), [])


class NativeFp8Test(parameterized.TestCase):
  """`--keep_fp8` on the Qwen3.5-FP8 row (its logits at devices {1, 16} x scan {on, off} are in families_test)."""

  @parameterized.parameters(True, False)
  def test_maxtext_dequantization_is_the_dequantized_conversion(self, scan):
    quantized, _, _ = quantized_model("qwen3_5_fp8")
    flags = ("--save_dtype=float32", "--simulated_cpu_devices_count=1", f"--scan_layers={scan}")
    native_items = convert(quantized, "--keep_fp8", *flags)
    native = checkpoint_io.restore_v0(native_items)["params"]["params"]
    plain = checkpoint_io.restore_v0(convert(quantized, *flags))["params"]["params"]
    native_leaves, plain_leaves = checkpoint_io.flatten(native), checkpoint_io.flatten(plain)
    scale_of = lambda key: key[:-2] + "_scale']"  # "...['kernel']" -> "...['kernel_scale']"
    kernels = {k: v for k, v in native_leaves.items() if v.dtype == ml_dtypes.float8_e4m3fn}
    scales = {k for k in native_leaves if k.endswith("_scale']")}
    # Every projection, shared and routed expert kernel: 8 per linear-attention layer (qkvz, out, 3 shared, 3
    # routed), 10 per full-attention layer (q, k, v, out + 6); none of the routers, conv1d, norms, in_proj_ba.
    expected_kernels = (6 * 8 + 2 * 10) if not scan else (3 * 8 + 10)
    self.assertLen(kernels, expected_kernels)
    self.assertLen(scales, expected_kernels)
    self.assertEqual(set(native_leaves) - scales, set(plain_leaves))
    for key in kernels:
      self.assertEqual(native_leaves[scale_of(key)].dtype, np.float32)
      self.assertEqual(kernels[key].nbytes * 4, plain_leaves[key].nbytes)
    dequantized = validate_lib.dequantize_fp8_leaves(native)
    self.assertEqual(checkpoint_io.trees_bit_identical(dequantized, plain), [])
    overrides = ConversionRecord.read(native_items).maxtext_overrides
    self.assertEqual((overrides["weight_dtype"], overrides["weight_block_size"]), ("float8_e4m3fn", 32))
    self.assertEqual(layout_inspection.unchecksummed_leaves(native_items), [])  # FP8 kernels and scales alike.
    self.assertIn("in_proj_ba", overrides["unquantized_modules"])

  def test_laid_out_again_it_keeps_the_fp8_kernels_and_scales(self):
    """--checkpoint_path on a --keep_fp8 checkpoint (scanned -> unscanned) equals the --keep_fp8 conversion to that
    layout: FP8 kernels byte for byte, their scale leaves re-laid beside them, the fp8 overrides recorded."""
    quantized, _, _ = quantized_model("qwen3_5_fp8")
    flags = ("--save_dtype=float32", "--simulated_cpu_devices_count=1")
    scanned = convert(quantized, "--keep_fp8", *flags, "--scan_layers=true")
    relaid = os.path.join(harness.scratch_dir("relaid-"), "out")
    result = harness.run_converter(f"--checkpoint_path={scanned}", f"--output_dir={relaid}", "--scan_layers=false",
                                   *flags)
    self.assertIn('weight_dtype="float8_e4m3fn" weight_block_size=32', result.stdout)
    self.assertIn("source:        fp8 weights, kept as float8_e4m3fn with their scales", result.stdout)
    items = os.path.join(relaid, "0", "items")
    direct = convert(quantized, "--keep_fp8", *flags, "--scan_layers=false")
    got, expected = checkpoint_io.restore_v0(items), checkpoint_io.restore_v0(direct)
    self.assertEqual(checkpoint_io.trees_bit_identical(got, expected), [])
    leaves = checkpoint_io.flatten(got["params"]["params"])
    self.assertLen([v for v in leaves.values() if v.dtype == ml_dtypes.float8_e4m3fn], 6 * 8 + 2 * 10)
    self.assertEqual(ConversionRecord.read(items).fp8, ConversionRecord.read(direct).fp8)
    self.assertEqual(layout_inspection.unchecksummed_leaves(items), [])

  def test_scales_regrouped_per_key_head_in_block_units(self):
    # in_proj_qkvz (E 128, 2 key heads x [q 32 | k 32 | v 64 | z 64]): 4 x 12 scales; key head 1 takes blocks 6-11
    # from in_proj_qkv's block rows 1 (q1), 3 (k1), 6-7 (v1) and in_proj_z's rows 2-3 (z1), transposed.
    quantized, _, _ = quantized_model("qwen3_5_fp8")
    native = checkpoint_io.restore_v0(convert(quantized, "--keep_fp8", "--simulated_cpu_devices_count=1",
                                              "--scan_layers=false"))["params"]["params"]["decoder"]
    stored = quantize.load_tensors(quantized)
    qkv = stored["model.layers.1.linear_attn.in_proj_qkv.weight_scale_inv"].astype(np.float32)
    z = stored["model.layers.1.linear_attn.in_proj_z.weight_scale_inv"].astype(np.float32)
    scale = native["layers_1"]["attention"]["in_proj_qkvz"]["kernel_scale"]
    self.assertEqual(scale.shape, (4, 12))
    np.testing.assert_array_equal(scale[:, 6:12], np.concatenate([qkv[[1, 3, 6, 7]], z[2:4]]).T)
    # A heads kernel (E, H 4, 2D 128): H is below the block, so one scale per head; 2D holds 4 blocks.
    query = native["layers_3"]["attention"]["attention"]["query"]
    self.assertEqual(query["kernel_scale"].shape, (4, 4, 4))
    q = stored["model.layers.3.self_attn.q_proj.weight_scale_inv"].astype(np.float32)  # (16, 4): 4 per head
    np.testing.assert_array_equal(query["kernel_scale"][:, 2], q[8:12].T)
    wo = native["layers_0"]["mlp"]["routed_experts"]["wo_scale"]
    self.assertEqual(wo.shape, (4, 2, 4))  # (experts, M 64 / 32, E 128 / 32)
    np.testing.assert_array_equal(
        wo[3], stored["model.layers.0.mlp.experts.3.down_proj.weight_scale_inv"].astype(np.float32).T)

  def test_refused_with_the_reason(self):
    quantized, reference_dir, _ = quantized_model("qwen3_5_fp8")
    harness.assert_refused(self, reference_dir, "--keep_fp8 needs an FP8 checkpoint", flags=("--keep_fp8",))
    deepseek, _, _ = quantized_model("fp8")
    harness.assert_refused(self, deepseek, "MaxText has no fp8 model for deepseek", "qwen3_5", flags=("--keep_fp8",))
    base = tiny_models.build_tiny_model("qwen3_5", harness.scratch_dir("qwen3_5-hf-"), head_dim=64,
                                        linear_key_head_dim=32, linear_value_head_dim=32)
    weights = quantize.QWEN3_5_FP8_WEIGHTS.match
    non_square = quantize.quantize_fp8(base, harness.scratch_dir("fp8-"), (32, 64), weights)
    harness.assert_refused(self, non_square, "32x64", "one weight_block_size", flags=("--keep_fp8",))
    # Blocks of 48 rows: a MaxText block of key (E, KV 2, D 64) spans rows 0-47 and 48-63 of HF's first blocks.
    misaligned = quantize.quantize_fp8(base, harness.scratch_dir("fp8-"), (48, 48), weights)
    harness.assert_refused(self, misaligned, "do not line up", "without --keep_fp8", flags=("--keep_fp8",))
    # One q_proj left in BF16 where MaxText's tree holds FP8: never quantized here.
    partial = quantize.quantize_fp8(base, harness.scratch_dir("fp8-"), (32, 32),
                                    lambda n: weights(n) and n != "model.layers.7.self_attn.q_proj.weight")
    harness.assert_refused(self, partial, "model.layers.7.self_attn.q_proj.weight", "never quantizes",
                           flags=("--keep_fp8",))

  def test_dry_run_shows_kept_fp8_leaves(self):
    quantized, _, _ = quantized_model("qwen3_5_fp8")
    out = os.path.join(harness.scratch_dir("dry-"), "out")
    result = harness.run_converter(f"--hf_model_path={quantized}", f"--output_dir={out}", "--dry_run", "--keep_fp8")
    self.assertIn("kernels kept as float8_e4m3fn with their scales (32-element blocks)", result.stdout)
    self.assertIn("kernel_scale", result.stdout)
    self.assertIn("float8_e4m3fn", result.stdout)
    self.assertFalse(os.path.exists(out))


def _zstd_levels(items: str) -> set[int]:
  reader = CheckpointReader(items)
  return {codec["configuration"]["level"] for array in reader.arrays.values()
          for codec in reader.chunk_codecs(array) if codec["name"] == "zstd"}


def variant(fmt: str, *, config_change=None, drop: str | None = None, replace=None) -> str:
  """The `fmt` model's quantized checkpoint with its config changed, a stored tensor dropped or replaced."""
  quantized, _, _ = quantized_model(fmt)
  with open(os.path.join(quantized, "config.json")) as f:
    config = json.load(f)
  tensors = quantize.load_tensors(quantized)
  if config_change:
    config_change(config)
  if drop:
    del tensors[drop]
  if replace:
    tensors.update(replace)
  path = harness.scratch_dir("bad-quantized-")
  write_safetensors(os.path.join(path, "model.safetensors"), tensors)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  return path


class QuantizedBadInputTest(absltest.TestCase):

  def variant(self, fmt: str, **changes) -> str:
    return variant(fmt, **changes)

  def assert_refused(self, model_dir: str, *expected: str) -> None:
    harness.assert_refused(self, model_dir, *expected)

  def test_unknown_quant_method_names_it_and_the_supported_ones(self):
    path = self.variant("fp8", config_change=lambda c: c["quantization_config"].update(quant_method="gptq"))
    self.assert_refused(path, "'gptq'", "fp8", "mxfp4", "config.json")

  def test_fp8_weight_without_its_scale(self):
    name = "model.layers.1.mlp.experts.3.up_proj.weight"
    self.assert_refused(self.variant("fp8", drop=name + "_scale_inv"), name, "F8_E4M3", "_scale_inv")

  def test_fp8_scales_that_do_not_fit_the_block_size(self):
    path = self.variant("fp8", config_change=lambda c: c["quantization_config"].update(weight_block_size=[128, 128]))
    self.assert_refused(path, "_scale_inv", "128x128", "weight_block_size")

  def test_fp8_without_a_block_size(self):
    path = self.variant("fp8", config_change=lambda c: c["quantization_config"].pop("weight_block_size"))
    self.assert_refused(path, "weight_block_size", "never inferred")

  def test_mxfp4_blocks_without_scales(self):
    name = "model.layers.2.mlp.experts.down_proj"
    self.assert_refused(self.variant("mxfp4", drop=name + "_scales"), name + "_blocks", "_scales")

  def test_deepseek4_packed_expert_without_its_scale(self):
    name = "layers.4.ffn.experts.5.w3"
    self.assert_refused(self.variant("deepseek4_fp8", drop=name + ".scale"), f"{name}.weight", "I8", f"{name}.scale")

  def test_deepseek4_packed_experts_without_expert_dtype(self):
    path = self.variant("deepseek4_fp8", config_change=lambda c: c.pop("expert_dtype"))
    self.assert_refused(path, ".scale' is a block scale", "has dtype I8", "expert_dtype: fp4")

  def test_fp8_weight_in_a_checkpoint_without_quantization_config(self):
    path = self.variant("fp8", config_change=lambda c: c.pop("quantization_config"))
    self.assert_refused(path, "F8_E4M3", "only floating-point weights", "quantization_config")


class Deepseek4QuantizedTest(parameterized.TestCase):
  """DeepSeek V4 as the hub ships it (tools/testing/tiny_models.py `deepseek4_fp8`: FP8 with F8_E8M0 `.scale` grids
  in 48x40 blocks, routed experts packed FP4, mixers, sinks, `ape` and the routing bias in F32); its logits at devices
  {1, 16} x scan {on, off} are in families_test, through MaxText in the interop step."""

  @parameterized.parameters("float32", "bfloat16")
  def test_deepseek4_leaves_equal_the_numpy_dequantization(self, save_dtype):
    quantized, reference_dir, _ = quantized_model("deepseek4_fp8")
    flags = (f"--save_dtype={save_dtype}", "--simulated_cpu_devices_count=1")
    ours = checkpoint_io.restore_v0(convert(quantized, *flags))
    expected = checkpoint_io.restore_v0(convert(reference_dir, *flags))
    self.assertEqual(checkpoint_io.trees_bit_identical(ours, expected), [])

  def test_f32_tensors_stay_f32_and_packed_experts_unpack_in_place(self):
    # The bfloat16 conversion above (the default), read leaf by leaf against the stored tensors: the hub's F32
    # tensors are not bfloat16 numbers and stay float32 (MaxText's dequantizer rounds them, 1.51 in the logits);
    # FP4 and FP8 dequantize to bfloat16 numbers, exactly; FP4 is (out, in) once unpacked.
    quantized, _, _ = quantized_model("deepseek4_fp8")
    stored = quantize.load_tensors(quantized)
    decoder = checkpoint_io.restore_v0(convert(quantized, "--save_dtype=bfloat16", "--simulated_cpu_devices_count=1"))[
        "params"]["params"]["decoder"]
    layer = decoder["layers_2"]  # A hash-routed CSA layer: unrolled in the scanned tree too.
    fn = stored["layers.2.hc_attn_fn"]
    self.assertEqual(fn.dtype, np.float32)
    self.assertFalse(np.array_equal(fn, fn.astype(ml_dtypes.bfloat16).astype(np.float32)))
    for leaf, value in ((layer["mhc_attention"]["res_alpha"], fn[6:].T),
                        (layer["self_attention"]["sinks"], stored["layers.2.attn.attn_sink"]),
                        (layer["self_attention"]["csa_compressor"]["position_bias"],
                         stored["layers.2.attn.compressor.ape"]),
                        (decoder["scanned_blocks"]["layers_0"]["mlp"]["MoeBlock_0"]["gate"]["bias"][0],
                         stored["layers.3.ffn.gate.bias"])):
      self.assertEqual(leaf.dtype, np.float32)
      np.testing.assert_array_equal(leaf, value)
    for e in (0, 7):
      expert = f"layers.2.ffn.experts.{e}"
      for leaf, proj in (("wi_0", "w1"), ("wo", "w2")):
        self.assertEqual(stored[f"{expert}.{proj}.weight"].dtype, np.int8)
        self.assertEqual(layer["mlp"]["MoeBlock_0"][leaf].dtype, ml_dtypes.bfloat16)
        np.testing.assert_array_equal(layer["mlp"]["MoeBlock_0"][leaf][e].astype(np.float32), quantize.fp4_dequantize(
            stored[f"{expert}.{proj}.weight"], stored[f"{expert}.{proj}.scale"]).T)
    wq_a = quantize.fp8_dequantize(stored["layers.2.attn.wq_a.weight"], stored["layers.2.attn.wq_a.scale"], (48, 40))
    np.testing.assert_array_equal(layer["self_attention"]["wq_a"]["kernel"].astype(np.float32),
                                  wq_a.T)  # 48 x 256: 7 blocks, 1 partial.

  def test_base_checkpoints_ship_fp8_experts(self):
    base = tiny_models.build_tiny_model("deepseek4", harness.scratch_dir("deepseek4-hf-"))
    quantized = quantize.quantize_deepseek4(base, harness.scratch_dir("deepseek4-base-"), (48, 40),
                                            expert_dtype="fp8")
    stored = quantize.load_tensors(quantized)
    self.assertEqual(stored["layers.5.ffn.experts.3.w2.weight"].dtype, ml_dtypes.float8_e4m3fn)
    experts = checkpoint_io.restore_v0(convert(quantized, "--save_dtype=float32", "--simulated_cpu_devices_count=1",
                                               "--scan_layers=false"))["params"]["params"]["decoder"]["layers_5"][
                                                   "mlp"]["MoeBlock_0"]
    for leaf, proj in (("wi_1", "w3"), ("wo", "w2")):
      name = f"layers.5.ffn.experts.3.{proj}"
      np.testing.assert_array_equal(experts[leaf][3], quantize.fp8_dequantize(
          stored[name + ".weight"], stored[name + ".scale"], (48, 40)).T)

  def test_dry_run_names_the_formats_and_keep_fp8_is_refused(self):
    quantized, _, _ = quantized_model("deepseek4_fp8")
    out = os.path.join(harness.scratch_dir("dry-"), "out")
    result = harness.run_converter(f"--hf_model_path={quantized}", f"--output_dir={out}", "--dry_run")
    for expected in ("F8_E4M3 x F8_E8M0 scales, 48x40 blocks", "FP4 e2m1 (I8 pairs x F8_E8M0 scales per 32)",
                     "fp8 weights dequantized while streaming"):
      self.assertIn(expected, result.stdout)
    self.assertFalse(os.path.exists(out))
    harness.assert_refused(self, quantized, "--keep_fp8", "MaxText has no fp8 model for deepseek4",
                           flags=("--keep_fp8",))

  def test_full_size_flash_plans_from_its_headers_alone(self):
    # DeepSeek-V4-Flash at full size (43 layers + the MTP block, 256 FP4 experts a layer: 160 GB) written sparse:
    # every pair's dtypes and shapes checked and the scanned tree planned without reading a weight.
    model_dir = harness.scratch_dir("deepseek4-flash-")
    config = synthetic_checkpoint.deepseek4_config()
    synthetic_checkpoint.write_checkpoint(model_dir, config, list(synthetic_checkpoint.deepseek4_shapes(config)),
                                          sparse=True)
    out = os.path.join(harness.scratch_dir("dry-"), "out")
    result = harness.run_converter(f"--hf_model_path={model_dir}", f"--output_dir={out}", "--dry_run")
    for expected in ("-> MaxText deepseek4-284b, scanned", "leaves:            220",
                     "365 F8_E4M3 x F8_E8M0 scales, 128x128 blocks",  # 43 x (5 attention + 3 shared) + 21 indexers.
                     "33024 FP4 e2m1 (I8 pairs x F8_E8M0 scales per 32)"):  # 43 layers x 256 experts x 3.
      self.assertIn(expected, result.stdout)
    self.assertIn("skipped 797 tensor(s) (mtp.0.", result.stdout + result.stderr)


class KimiInt4Test(parameterized.TestCase):
  """Kimi K2-Thinking and K2.5 / K2.6 as they ship (tools/testing/tiny_models.py `kimi_k2`, `kimi_k25`: routed
  experts INT4 in compressed-tensors' pack-quantized format, written by compressed-tensors itself, groups of 16 with
  BF16 scales spread over 2^-2..2^3; K2.5's text model under `language_model.` beside a vision tower); their logits
  at devices {1, 16} x scan {on, off} are in families_test, through MaxText in the interop step."""

  @parameterized.parameters(("kimi_k2", "bfloat16"), ("kimi_k25", "float32"))
  def test_leaves_equal_compressed_tensors_unpacking_times_the_scales(self, model, save_dtype):
    # Codes times scales in float32, rounded once: the bytes of converting the float32 reference. In bfloat16 that
    # rounding changes a third of the experts' values (MaxText's own dequantizer rounds the product before it).
    quantized, reference_dir, _ = quantized_model(model)
    flags = (f"--save_dtype={save_dtype}", "--simulated_cpu_devices_count=1", "--target_model=kimi-k2-1t")
    ours, expected = convert(quantized, *flags), convert(reference_dir, *flags)
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(ours),
                                                       checkpoint_io.restore_v0(expected)), [])
    self.assertEqual(ConversionRecord.read(ours).quant_method, "compressed-tensors")
    self.assertEqual(_zstd_levels(ours), {3})

  def test_dry_run_names_the_format_and_the_skipped_vision_tower(self):
    quantized, _, _ = quantized_model("kimi_k25")
    out = os.path.join(harness.scratch_dir("dry-"), "out")
    result = harness.run_converter(f"--hf_model_path={quantized}", f"--output_dir={out}", "--dry_run")
    self.assertIn("-> MaxText kimi-k2", result.stdout)
    self.assertIn("90 int4 pack-quantized, groups of 16 scales (I32 x BF16)", result.stdout)  # 3 layers x 10 x 3.
    self.assertIn("compressed-tensors weights dequantized while streaming", result.stdout)
    warnings = result.stdout + result.stderr
    self.assertIn("skipped 29 tensor(s) (vision_tower.", warnings)
    self.assertIn("MaxText 0.2.5's kimi-k2-1t is text only", warnings)
    self.assertIn("skipped 6 tensor(s) (mm_projector.", warnings)
    self.assertFalse(os.path.exists(out))

  @parameterized.parameters("kimi_k2", "kimi_k25")
  def test_back_to_huggingface_is_the_dequantized_text_model_transformers_loads(self, model):
    quantized, reference_dir, reference = quantized_model(model)
    items = convert(quantized, "--save_dtype=float32", "--simulated_cpu_devices_count=16", "--scan_layers=true",
                    "--target_model=kimi-k2-1t")
    back = os.path.join(harness.scratch_dir("back-"), "hf")
    result = harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={items}", f"--output_dir={back}")
    self.assertIn("come back dequantized", result.stderr + result.stdout)
    tensors = load_file(os.path.join(back, "model.safetensors"))
    expected = {n: v for n, v in load_file(os.path.join(reference_dir, "model.safetensors")).items()
                if not n.startswith(("vision_tower.", "mm_projector."))}
    self.assertEqual(sorted(tensors), sorted(expected))
    for name, value in expected.items():
      self.assertEqual(tensors[name].tobytes(), value.tobytes(), name)
    with open(os.path.join(back, "config.json")) as f:
      written = json.load(f)
    text = written.get("text_config", written)
    self.assertNotIn("quantization_config", text)
    self.assertEqual(_serving_problems(quantized, back), [])
    # K2-Thinking's remote-code model type becomes the one transformers runs it as; K2.5 keeps its wrapper,
    # whose config transformers reads natively (its tower, not written, is left initialised).
    self.assertEqual((written["model_type"], "auto_map" in written),
                     ("deepseek_v3", False) if model == "kimi_k2" else ("kimi_k25", False))
    logits = validate_lib.reference_logits(back, validate_lib.token_ids(419, 2, 32, 0))
    np.testing.assert_allclose(logits, reference, atol=1e-5, rtol=0)

  def test_fused_int4_experts_read_as_the_per_expert_ones(self):
    """Qwen3.5-MoE's experts fused as its hub repos store them (gate_up_proj (X, 2M, E), down_proj (X, E, M)), each
    fused tensor packed INT4 whole by compressed-tensors' own compressor (llm-compressor's repack of compressed
    experts): the same leaves as converting their numpy dequantization."""
    base = tiny_models.build_tiny_model("qwen3_5", harness.scratch_dir("qwen3_5-hf-"))
    fused = quantize.fuse_experts(base, harness.scratch_dir("qwen3_5-fused-"))
    quantized = quantize.quantize_compressed_int4(fused, harness.scratch_dir("qwen3_5-int4-"), (1, 16),
                                                  selects=quantize.FUSED_EXPERT_WEIGHTS.match)
    with safe_open(os.path.join(quantized, "model.safetensors"), "np") as f:
      self.assertEqual(f.get_slice("model.layers.0.mlp.experts.gate_up_proj.weight_packed").get_shape(), [4, 128, 16])
    reference = quantize.dequantize(quantized, harness.scratch_dir("qwen3_5-int4-dequantized-"))
    out = os.path.join(harness.scratch_dir("dry-"), "out")
    result = harness.run_converter(f"--hf_model_path={quantized}", f"--output_dir={out}", "--dry_run")
    experts = [line.split() for line in result.stdout.splitlines() if "routed_experts/w" in line]
    self.assertLen(experts, 12)  # wi_0, wi_1 and wo of 4 scanned blocks, each read from the fused INT4 tensors.
    self.assertTrue(all("int4 pack-quantized, groups of 16 scales (I32 x BF16)" in " ".join(line) for line in experts))
    flags = ("--save_dtype=float32", "--simulated_cpu_devices_count=1")
    ours, expected = convert(quantized, *flags), convert(reference, *flags)
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(ours),
                                                       checkpoint_io.restore_v0(expected)), [])
    self.assertEqual(ConversionRecord.read(ours).quant_method, "compressed-tensors")

  def test_malformed_int4_tensors_and_unknown_schemes_are_refused_by_name(self):
    module = "model.layers.2.mlp.experts.7.down_proj"
    cases = (
        (dict(replace={f"{module}.weight_shape": np.array([224, 200], np.int32)}),
         (f"{module}.weight_shape", "says the weight is [224, 200]", "[224, 96]")),
        (dict(drop=f"{module}.weight_scale"), (f"{module}.weight_packed", "has no", "weight_scale")),
        (dict(config_change=lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(
            strategy="tensor_group")), ("config_groups.group_0.weights.strategy 'tensor_group'", "config.json")),
    )
    for change, expected in cases:
      with self.subTest(expected[0]):
        harness.assert_refused(self, variant("kimi_k2", **change), *expected)


# The cases that share a quantized model run in one shard (each built, dequantized and run through transformers
# once): the matrix cells by the format in their name, the others by the model they read.
SHARD_GROUPS = harness.model_group(
    r"test_logits_match_transformers_on_the_dequantized_weights_(.+?)_devices\d+_",
    {**{f"test_every_leaf_equals_the_numpy_dequantization{i}": fmt
        for i, fmt in enumerate(fmt for fmt in FORMATS for _ in range(2))},  # Product order: fmt, then save_dtype.
     **{f"test_back_to_huggingface_gives_the_dequantized_weights{i}": fmt for i, fmt in enumerate(FORMATS)},
     "test_fp8_blocks_are_taken_from_the_config_not_the_shapes": "fp8",
     "test_dry_run_shows_each_source_format": "fp8",  # fp8 and mxfp4: one shard holds both (8 + 7 cases).
     **{name: "deepseek4_fp8" for name in (
         "test_deepseek4_leaves_equal_the_numpy_dequantization0",
         "test_deepseek4_leaves_equal_the_numpy_dequantization1",
         "test_f32_tensors_stay_f32_and_packed_experts_unpack_in_place", "test_base_checkpoints_ship_fp8_experts",
         "test_dry_run_names_the_formats_and_keep_fp8_is_refused", "test_deepseek4_packed_expert_without_its_scale",
         "test_back_to_huggingface_gives_the_dequantized_weights3",
         "test_deepseek4_packed_experts_without_expert_dtype")},
     **{name: "kimi" for name in (
         "test_leaves_equal_compressed_tensors_unpacking_times_the_scales0",
         "test_leaves_equal_compressed_tensors_unpacking_times_the_scales1",
         "test_dry_run_names_the_format_and_the_skipped_vision_tower",
         "test_back_to_huggingface_is_the_dequantized_text_model_transformers_loads0",
         "test_back_to_huggingface_is_the_dequantized_text_model_transformers_loads1",
         "test_malformed_int4_tensors_and_unknown_schemes_are_refused_by_name")},
     "test_fused_int4_experts_read_as_the_per_expert_ones": "qwen3_5_int4",
     **{name: "qwen3_5_fp8" for name in ("test_dry_run_shows_kept_fp8_leaves", "test_refused_with_the_reason",
                                         "test_maxtext_dequantization_is_the_dequantized_conversion0",
                                         "test_maxtext_dequantization_is_the_dequantized_conversion1",
                                         "test_scales_regrouped_per_key_head_in_block_units",
                                         "test_laid_out_again_it_keeps_the_fp8_kernels_and_scales")}})

if __name__ == "__main__":
  absltest.main(testLoader=harness.GroupShardingLoader(SHARD_GROUPS))
