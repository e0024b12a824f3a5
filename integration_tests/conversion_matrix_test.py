"""Qwen3 conversion at devices {1, 16} x scan {on, off} x lazy {on, off}, proven by logits and by bytes.

The bug this project exists for hid at 1 device while CI only ever ran 16: every cell runs here, each one
checked against transformers' logits, and the lazy arms' saved tensors against the eager arm's bit for bit.
"""

from __future__ import annotations

import itertools
import os

from absl.testing import absltest, parameterized

from integration_tests import harness

harness.start_jax()

import numpy as np  # pylint: disable=g-import-not-at-top,g-bad-import-order

from tools import checkpoint_io, validate_lib  # pylint: disable=g-import-not-at-top
from tools.testing import tiny_models

CELLS = [
    dict(testcase_name=f"devices{d}_{'scan' if s else 'noscan'}_{'lazy' if l else 'eager'}", devices=d, scan=s, lazy=l)
    for d, s, l in itertools.product((1, 16), (True, False), (True, False))
]
THRESHOLDS = validate_lib.Thresholds()  # The float32 bar (its defaults).


class ConversionMatrixTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model_dir = tiny_models.build_tiny_model("qwen3", harness.scratch_dir("qwen3-hf-"))
    config = validate_lib.load_model_config(cls.model_dir)
    cls.ids = validate_lib.token_ids(config.vocab_size, batch=2, seq_len=32, seed=0)
    cls.reference = validate_lib.reference_logits(cls.model_dir, cls.ids)
    cls.converted: dict[tuple, str] = {}

  @classmethod
  def convert(cls, devices: int, scan: bool, lazy: bool, save_dtype: str = "float32") -> str:
    key = (devices, scan, lazy, save_dtype)
    if key not in cls.converted:
      out = harness.scratch_dir("qwen3-mt-")
      harness.run_converter(
          f"--hf_model_path={cls.model_dir}", f"--output_dir={out}", f"--simulated_cpu_devices_count={devices}",
          f"--scan_layers={scan}", f"--lazy_load_tensors={lazy}", f"--save_dtype={save_dtype}",
      )
      cls.converted[key] = os.path.join(out, "0", "items")
    return cls.converted[key]

  @parameterized.named_parameters(*CELLS)
  def test_logits_match_transformers(self, devices, scan, lazy):
    items = self.convert(devices, scan, lazy)
    report = validate_lib.validate(self.model_dir, items, reference=self.reference)
    self.assertEqual(report.failures(THRESHOLDS), [], report)
    self.assertTrue(report.v0_v1_identical)

  @parameterized.named_parameters(*CELLS)
  def test_saved_tensors_identical_to_eager_single_device(self, devices, scan, lazy):
    items = self.convert(devices, scan, lazy)
    eager = self.convert(1, scan, False)
    diffs = checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(items), checkpoint_io.restore_v0(eager))
    self.assertEqual(diffs, [])

  @parameterized.named_parameters(*CELLS)
  def test_metadata_records_standard_types(self, devices, scan, lazy):
    items = self.convert(devices, scan, lazy)
    types = checkpoint_io.leaf_value_types(items)
    array_types = {t for key, t in types.items() if "'params'" in key}
    self.assertEqual(array_types, {"jax.Array" if devices > 1 else "np.ndarray"})
    self.assertEqual(types["('step',)"], "scalar")
    metadata = checkpoint_io.custom_metadata(items)
    self.assertIs(metadata["scan_layers"], scan)
    self.assertEqual(metadata["hf2maxtext"]["family"], "qwen3")

  @parameterized.named_parameters(
      dict(testcase_name="devices1_lazy", devices=1, lazy=True),
      dict(testcase_name="devices16_lazy", devices=16, lazy=True),
      dict(testcase_name="devices1_eager", devices=1, lazy=False),
  )
  def test_bfloat16_matches_reference_on_rounded_weights(self, devices, lazy):
    items = self.convert(devices, True, lazy, save_dtype="bfloat16")
    leaves = checkpoint_io.flatten(checkpoint_io.restore_v0(items))
    self.assertEqual({str(v.dtype) for k, v in leaves.items() if "'params'" in k}, {"bfloat16"})
    rounded_reference = validate_lib.reference_logits(self.model_dir, self.ids, "bfloat16")
    report = validate_lib.validate(self.model_dir, items, reference=rounded_reference)
    self.assertEqual(report.failures(THRESHOLDS), [], report)
    # The float32 reference must be measurably different, or this arm would not test the rounding at all.
    unrounded = validate_lib.compare_logits(
        validate_lib.checkpoint_logits(self.model_dir, items, self.ids).logits, self.reference
    )[0]
    self.assertGreater(unrounded, report.max_abs_diff)

  @parameterized.parameters(1, 16)
  def test_uncompressed_output_holds_the_same_values(self, devices):
    out = harness.scratch_dir("qwen3-none-")
    harness.run_converter(f"--hf_model_path={self.model_dir}", f"--output_dir={out}",
                          f"--simulated_cpu_devices_count={devices}", "--save_dtype=float32", "--compression=none")
    items = os.path.join(out, "0", "items")
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(items),
                                                       checkpoint_io.restore_v0(self.convert(1, True, False))), [])
    report = validate_lib.validate(self.model_dir, items, reference=self.reference)
    self.assertEqual(report.failures(THRESHOLDS), [], report)
    compressed = os.path.join(self.convert(devices, True, True), "..", "..")
    size = lambda root: sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
    self.assertGreater(size(out), size(compressed))  # Random float32 weights still compress a little with zstd.

  def test_scanned_leaf_is_unscanned_leaves_stacked_on_axis_1(self):
    scanned = checkpoint_io.restore_v0(self.convert(1, True, True))["params"]["params"]["decoder"]
    unscanned = checkpoint_io.restore_v0(self.convert(1, False, True))["params"]["params"]["decoder"]
    query = scanned["layers"]["self_attention"]["query"]["kernel"]
    self.assertEqual(query.shape, (256, 8, 4, 96))
    for i in range(8):
      np.testing.assert_array_equal(query[:, i], unscanned[f"layers_{i}"]["self_attention"]["query"]["kernel"])

  def test_query_kernel_holds_exact_unscaled_projection(self):
    # Qwen3 applies the query scale at run time; a scale baked into the kernel would hide in the logits behind
    # the q-norm, so the values are compared exactly against the HF tensor.
    from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

    hf = load_file(os.path.join(self.model_dir, "model.safetensors"))
    decoder = checkpoint_io.restore_v0(self.convert(1, False, True))["params"]["params"]["decoder"]
    for i in (0, 7):
      expected = hf[f"model.layers.{i}.self_attn.q_proj.weight"].T.reshape(256, 4, 96)
      np.testing.assert_array_equal(decoder[f"layers_{i}"]["self_attention"]["query"]["kernel"], expected)
      expected_norm = hf[f"model.layers.{i}.self_attn.k_norm.weight"]
      np.testing.assert_array_equal(decoder[f"layers_{i}"]["self_attention"]["key_norm"]["scale"], expected_norm)


if __name__ == "__main__":
  absltest.main()
