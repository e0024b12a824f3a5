"""MaxText -> MaxText through the binary (--direction=to_maxtext --checkpoint_path): a tiny DeepSeek V3 (a dense
and a MoE layer collection, experts, MLA) converted once, scanned in float32, then laid out again: unscanned in
float32 and scanned in bfloat16 for a target mesh. Each result equals the conversion straight from HuggingFace to
that layout leaf for leaf, bit for bit, in the same stored chunks; it keeps the original's record, so the way back
gives the original's tensors and serving files; and what cannot be laid out is refused with nothing left behind.
"""

from __future__ import annotations

import os
import shutil

from absl.testing import absltest

from integration_tests import harness

harness.start_jax()

import numpy as np  # pylint: disable=g-import-not-at-top,g-bad-import-order

from converter.layout import layout_inspection  # pylint: disable=g-import-not-at-top
from converter.checkpoint_format.record import ConversionRecord  # pylint: disable=g-import-not-at-top
from tools import checkpoint_io  # pylint: disable=g-import-not-at-top
from tools.testing import tiny_models

MESH = "--target_mesh=fsdp=4,tensor=2"


def _leaves(items: str) -> dict[str, np.ndarray]:
  return checkpoint_io.flatten(checkpoint_io.restore_v0(items)["params"])


def _relaid(items: str, *flags: str) -> tuple[str, str]:
  out = harness.scratch_dir("relaid-")
  result = harness.run_converter(f"--checkpoint_path={items}", f"--output_dir={out}", *flags)
  return os.path.join(out, "0", "items"), result.stdout


class RelayoutTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = tiny_models.build_tiny_model("deepseek3", harness.scratch_dir("deepseek3-hf-"))
    with open(os.path.join(cls.model, "tokenizer_config.json"), "w") as f:
      f.write("{}\n")  # A serving file the way back must find through the record the re-layout kept.
    cls.scanned = harness.converted(cls.model, "--save_dtype=float32", "--simulated_cpu_devices_count=4")

  def assert_bit_identical(self, got: str, expected: str) -> None:
    got_leaves, expected_leaves = _leaves(got), _leaves(expected)
    self.assertEqual(sorted(got_leaves), sorted(expected_leaves))
    for name, value in expected_leaves.items():
      self.assertEqual(got_leaves[name].dtype, value.dtype, name)
      np.testing.assert_array_equal(got_leaves[name].view(np.uint8), value.view(np.uint8), err_msg=name)

  def test_unscanned_float32_equals_the_direct_conversion_and_goes_back_to_the_original(self):
    items, stdout = _relaid(self.scanned, "--scan_layers=false", "--save_dtype=float32", "--verify")
    self.assertIn("verified:      ", stdout)
    self.assertIn(" 0 mismatches", stdout)
    self.assertIn("scan_layers=false", stdout)
    direct = harness.converted(self.model, "--save_dtype=float32", "--scan_layers=false",
                               "--simulated_cpu_devices_count=4")
    self.assert_bit_identical(items, direct)
    record, original = ConversionRecord.read(items), ConversionRecord.read(self.scanned)
    self.assertEqual((record.scan_layers, record.hf_config, record.hf_source), (False, original.hf_config,
                                                                                original.hf_source))
    back = os.path.join(harness.scratch_dir("relaid-back-"), "hf")
    harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={items}", f"--output_dir={back}")
    expected = checkpoint_io.read_safetensors_dir(self.model)
    got = checkpoint_io.read_safetensors_dir(back)
    self.assertEqual(sorted(got), sorted(expected))
    for name, value in expected.items():
      np.testing.assert_array_equal(got[name], value, err_msg=name)
    self.assertTrue(os.path.exists(os.path.join(back, "tokenizer_config.json")))

  def test_scanned_bfloat16_for_a_mesh_equals_the_direct_conversion_in_the_same_chunks(self):
    unscanned, _ = _relaid(self.scanned, "--scan_layers=false", "--save_dtype=float32")
    items, _ = _relaid(unscanned, "--scan_layers=true", "--save_dtype=bfloat16", MESH)
    direct = harness.converted(self.model, "--save_dtype=bfloat16", MESH, "--simulated_cpu_devices_count=4")
    self.assert_bit_identical(items, direct)
    got, _ = layout_inspection.stored_leaves(items)
    expected, _ = layout_inspection.stored_leaves(direct)
    self.assertEqual({name: (leaf.chunk, leaf.block) for name, leaf in got.items()},
                     {name: (leaf.chunk, leaf.block) for name, leaf in expected.items()})
    self.assertEqual(ConversionRecord.read(items).chunking, ConversionRecord.read(direct).chunking)

  def test_dry_run_plans_from_the_metadata_and_bad_inputs_are_refused(self):
    out = harness.scratch_dir("relaid-dry-")
    result = harness.run_converter(f"--checkpoint_path={self.scanned}", f"--output_dir={out}", "--dry_run",
                                   "--scan_layers=false")
    self.assertIn("MaxText float32", result.stdout)
    self.assertIn("predicted peak RSS", result.stdout)
    self.assertEqual(os.listdir(out), [])
    # A checkpoint that records no config (MaxText's own converter writes none) needs --hf_config_path.
    step = os.path.join(harness.scratch_dir("maxtexts-own-"), "0")
    shutil.copytree(os.path.dirname(self.scanned), step)
    os.remove(os.path.join(step, "_CHECKPOINT_METADATA"))
    refused = harness.scratch_dir("refused-")
    result = harness.run_converter(f"--checkpoint_path={step}", f"--output_dir={refused}", check=False)
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertIn("pass --hf_config_path", result.stderr)
    self.assertEqual(harness.committed_files(refused), [])
    items, _ = _relaid(step, f"--hf_config_path={self.model}", "--scan_layers=true", "--save_dtype=float32")
    self.assert_bit_identical(items, self.scanned)
    # Another family's checkpoint is refused, naming the leaf.
    qwen3 = tiny_models.build_tiny_model("qwen3", harness.scratch_dir("qwen3-hf-"))
    result = harness.run_converter(f"--checkpoint_path={step}", f"--output_dir={refused}",
                                   f"--hf_config_path={qwen3}", check=False)
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertRegex(result.stderr, r"error: .*leaf params/params/\S+ (is missing|has shape|has \d+ rows)")
    self.assertEqual(harness.committed_files(refused), [])
    result = harness.run_converter(f"--checkpoint_path={step}", f"--hf_model_path={self.model}",
                                   f"--output_dir={refused}", check=False)
    self.assertIn("not both", result.stderr)


if __name__ == "__main__":
  absltest.main()
