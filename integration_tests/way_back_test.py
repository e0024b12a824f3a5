"""The way back's conveniences through the binary, on one conversion of the tiny Qwen3 laid out as a training run's
directory: --step (latest committed, a number, a missing one), --dry_run (the plan, nothing written, a Hub output
untouched), --verify (every tensor re-read; roundtrip_test checks the files themselves) and --inspect."""

from __future__ import annotations

import os
import re
import shutil

from absl.testing import absltest

from integration_tests import harness
from tools.testing import tiny_models


class WayBackTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    model = tiny_models.build_tiny_model("qwen3", harness.scratch_dir("qwen3-"))
    converted = os.path.dirname(os.path.dirname(harness.converted(model, "--simulated_cpu_devices_count=1")))
    # A training run: committed steps 100 and 200, and Orbax's temporary directory of an unfinished step 300.
    cls.run_dir = harness.scratch_dir("run-")
    for step in ("100", "200", "300.orbax-checkpoint-tmp-1712345678"):
      shutil.copytree(os.path.join(converted, "0"), os.path.join(cls.run_dir, "checkpoints", step))

  def converter(self, *flags: str, check: bool = True):
    return harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={self.run_dir}", *flags,
                                 check=check)

  def assert_error(self, result, *expected: str) -> None:
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertNotIn("Traceback", result.stderr)
    for text in expected:
      self.assertIn(text, result.stderr)

  def test_latest_step_written_back_and_verified(self):
    out = os.path.join(harness.scratch_dir("back-"), "hf")
    result = self.converter(f"--output_dir={out}", "--verify", "--max_shard_size=2MB")
    self.assertIn(f"checkpoint:    {self.run_dir}/checkpoints/200/items", result.stdout)
    tensors = int(re.search(r"tensors:\s+(\d+)", result.stdout).group(1))
    total = int(re.search(r"bytes:\s+([\d,]+)", result.stdout).group(1).replace(",", ""))
    self.assertIn(f"verified:      {tensors} tensors, {total:,} bytes, 0 mismatches", result.stdout)
    self.assertIn("model.safetensors.index.json", os.listdir(out))

  def test_a_step_by_number_and_a_missing_one(self):
    result = self.converter("--output_dir=/unused", "--step=100", "--dry_run")
    self.assertIn(f"{self.run_dir}/checkpoints/100/items", result.stdout)
    self.assert_error(self.converter("--output_dir=/unused", "--step=150", check=False),
                      "error: ", "no step 150; steps present: 100, 200")
    self.assert_error(self.converter("--output_dir=/unused", "--step=150", "--inspect", check=False),
                      "no step 150")

  def test_the_relayout_reads_a_run_directory_too(self):
    out = harness.scratch_dir("relayout-")
    result = harness.run_converter(f"--checkpoint_path={self.run_dir}", "--step=100", f"--output_dir={out}",
                                   "--simulated_cpu_devices_count=1", "--dry_run")
    self.assertIn("token_embedder/embedding", result.stdout)
    self.assertEqual(os.listdir(out), [])

  def test_dry_run_plans_every_file_and_tensor_and_writes_nothing(self):
    parent = harness.scratch_dir("dry-")
    for out in (os.path.join(parent, "hf"), "hf://nobody/never-touched"):
      result = self.converter(f"--output_dir={out}", "--dry_run", "--max_shard_size=2MB")
      self.assertIn("qwen3 (Qwen3ForCausalLM) <- MaxText qwen3, scanned, bfloat16", result.stdout)
      self.assertRegex(result.stdout, r"model\.layers\.1\.mlp\.down_proj\.weight +\(256, 512\) +bfloat16 +262,144 +\d"
                                      r" +decoder/layers/mlp/wo/kernel\[:, 1\]")
      self.assertIn("shards:            7 (--max_shard_size=2MB)", result.stdout)
      self.assertIn("file:              model-00007-of-00007.safetensors: ", result.stdout)
      self.assertRegex(result.stdout, r"predicted peak RSS: [\d.]+ MiB")
    self.assertEqual(os.listdir(parent), [])
    # And it plans what the conversion writes: the same files with the same tensors.
    out = os.path.join(parent, "hf")
    self.converter(f"--output_dir={out}", "--max_shard_size=2MB")
    planned = dict(re.findall(r"file: +(model-\d+-of-\d+\.safetensors): (\d+) tensors", result.stdout))
    written = {name: str(len(_tensor_names(os.path.join(out, name)))) for name in os.listdir(out)
               if name.startswith("model-")}
    self.assertEqual(planned, written)

  def test_flags_the_way_back_refuses(self):
    self.assert_error(self.converter("--output_dir=hf://org/name", "--verify", check=False),
                      "--verify re-reads a model written to a disk or gs://")
    self.assert_error(self.converter("--output_dir=/unused", "--dry_run", "--export=lora_adapter", check=False),
                      "--dry_run plans a model written back, not --export=lora_adapter")

  def test_inspect_lists_steps_leaves_layout_and_record(self):
    result = harness.run_converter("--inspect", f"--checkpoint_path={self.run_dir}")
    self.assertIn(f"run directory:     {self.run_dir}/checkpoints: 2 steps: 100, 200", result.stdout)
    self.assertIn(f"checkpoint:        {self.run_dir}/checkpoints/200/items", result.stdout)
    self.assertIn("storage:           OCDBT, zarr3, 14 arrays", result.stdout)
    self.assertIn("layers:            scanned (stacked)", result.stdout)
    self.assertIn("family:            qwen3 (Qwen3ForCausalLM), target model qwen3, saved as bfloat16",
                  result.stdout)
    self.assertRegex(result.stdout, r"decoder/layers/mlp/wo/kernel +\(512, 8, 256\) +bfloat16 +\(512, 1, \d+\)"
                                    r" +\(512, 8, 256\) +transpose\(1, 2, 0\)\+zstd\(1\)\+checksum")


def _tensor_names(path: str) -> list[str]:
  from converter.sources.safetensors import read_header  # pylint: disable=g-import-not-at-top

  return list(read_header(path))


if __name__ == "__main__":
  absltest.main()
