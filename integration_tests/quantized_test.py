"""Checkpoints as DeepSeek and GPT-OSS ship them, quantized by the test itself, converted directly.

A tiny DeepSeek V3 gets FP8 block scales of 48x40 values (non-square, with partial last blocks on both axes of
most weights: 192 / 40, 64 / 40, 256 / 48 ...), a tiny GPT-OSS gets MXFP4 experts. Each conversion must equal,
bit for bit, the conversion of the same weights dequantized by an independent numpy reference (tools/quantize.py)
and saved as plain float32; its logits must match transformers run on those dequantized weights; `--dry_run`
names the storage formats; the reverse direction gives back the dequantized weights; and a quantized checkpoint
the converter cannot read is refused with the tensor and the reason.
"""

from __future__ import annotations

import itertools
import json
import os

from absl.testing import absltest, parameterized

from integration_tests import harness

harness.start_jax()

import numpy as np  # pylint: disable=g-import-not-at-top,g-bad-import-order
from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

from tools import checkpoint_io, quantize, tiny_models, validate_lib  # pylint: disable=g-import-not-at-top
from tools.safetensors_writer import write_safetensors  # pylint: disable=g-import-not-at-top

FP8_BLOCK = (48, 40)
THRESHOLDS = validate_lib.Thresholds(max_abs_diff=1e-4, min_cosine=0.99999, min_argmax_agreement=1.0)
CELLS = [dict(testcase_name=f"{fmt}_devices{d}_{'scan' if s else 'noscan'}", fmt=fmt, devices=d, scan=s)
         for fmt, d, s in itertools.product(("fp8", "mxfp4"), (1, 16), (True, False))]

_models: dict[str, tuple[str, str, np.ndarray]] = {}


def quantized_model(fmt: str) -> tuple[str, str, np.ndarray]:
  """(quantized checkpoint, its numpy dequantization in float32, transformers' logits on the latter)."""
  if fmt not in _models:
    base = tiny_models.build_tiny_model("deepseek3" if fmt == "fp8" else "gpt_oss", harness.scratch_dir(f"{fmt}-hf-"))
    if fmt == "fp8":
      quantized = quantize.quantize_fp8(base, harness.scratch_dir("fp8-"), FP8_BLOCK)
    else:
      quantized = quantize.quantize_mxfp4(base, harness.scratch_dir("mxfp4-"))
    reference = quantize.dequantize(quantized, harness.scratch_dir(f"{fmt}-dequantized-"))
    config = validate_lib.load_model_config(reference)
    logits = validate_lib.reference_logits(reference, validate_lib.token_ids(config.vocab_size, 2, 32, 0))
    _models[fmt] = (quantized, reference, logits)
  return _models[fmt]


def convert(model_dir: str, *flags: str) -> str:
  out = harness.scratch_dir("mt-")
  harness.run_converter(f"--hf_model_path={model_dir}", f"--output_dir={out}", *flags)
  return os.path.join(out, "0", "items")


class QuantizedTest(parameterized.TestCase):

  @parameterized.named_parameters(*CELLS)
  def test_logits_match_transformers_on_the_dequantized_weights(self, fmt, devices, scan):
    quantized, reference_dir, reference = quantized_model(fmt)
    items = convert(quantized, "--save_dtype=float32", f"--simulated_cpu_devices_count={devices}",
                    f"--scan_layers={scan}")
    report = validate_lib.validate(reference_dir, items, reference=reference)
    self.assertEqual(report.failures(THRESHOLDS), [], report)
    info = checkpoint_io.custom_metadata(items)["hf2maxtext"]
    self.assertEqual(info["quant_method"], fmt)

  @parameterized.product(fmt=("fp8", "mxfp4"), save_dtype=("float32", "bfloat16"))
  def test_every_leaf_equals_the_numpy_dequantization(self, fmt, save_dtype):
    # Dequantized in float32 and rounded once to the save dtype: the same bytes as converting the float32
    # reference, whatever the blocks, partial ones included.
    quantized, reference_dir, _ = quantized_model(fmt)
    flags = (f"--save_dtype={save_dtype}", "--simulated_cpu_devices_count=1")
    ours = checkpoint_io.restore_v0(convert(quantized, *flags))
    expected = checkpoint_io.restore_v0(convert(reference_dir, *flags))
    self.assertEqual(checkpoint_io.trees_bit_identical(ours, expected), [])

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

  @parameterized.parameters("fp8", "mxfp4")
  def test_back_to_huggingface_gives_the_dequantized_weights(self, fmt):
    quantized, reference_dir, _ = quantized_model(fmt)
    items = convert(quantized, "--save_dtype=bfloat16", "--simulated_cpu_devices_count=1")
    back = os.path.join(harness.scratch_dir("back-"), "hf")
    result = harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={items}", f"--output_dir={back}")
    self.assertIn("come back dequantized", result.stderr + result.stdout)
    tensors = load_file(os.path.join(back, "model.safetensors"))
    expected = load_file(os.path.join(reference_dir, "model.safetensors"))
    self.assertEqual(sorted(tensors), sorted(expected))
    for name, value in expected.items():
      self.assertEqual(tensors[name].tobytes(), value.astype(tensors[name].dtype).tobytes(), name)
    with open(os.path.join(back, "config.json")) as f:
      self.assertNotIn("quantization_config", json.load(f))


class QuantizedBadInputTest(absltest.TestCase):

  def variant(self, fmt: str, *, config_change=None, drop: str | None = None, replace=None) -> str:
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

  def test_fp8_weight_in_a_checkpoint_without_quantization_config(self):
    path = self.variant("fp8", config_change=lambda c: c.pop("quantization_config"))
    self.assert_refused(path, "F8_E4M3", "only floating-point weights", "quantization_config")


if __name__ == "__main__":
  absltest.main()
