"""The bundled tiny Qwen3 is exactly what the generator makes, and it converts to logits transformers agrees with."""

import filecmp
import os
import subprocess
import sys
import tempfile

import jax

jax.config.update("jax_platforms", "cpu")

from absl.testing import absltest  # pylint: disable=g-import-not-at-top,g-bad-import-order

import converter  # pylint: disable=g-import-not-at-top
from tools import make_tiny_checkpoint, validate_lib

REPO = os.path.dirname(os.path.dirname(converter.__file__))
BUNDLED = os.path.join(REPO, "testdata", "tiny-qwen3")


class MakeTinyCheckpointTest(absltest.TestCase):

  def test_bundled_checkpoint_is_regenerated_byte_for_byte(self):
    out = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    make_tiny_checkpoint.write_tiny_qwen3(out)
    for name in ("config.json", "model.safetensors"):
      self.assertTrue(filecmp.cmp(os.path.join(out, name), os.path.join(BUNDLED, name), shallow=False), name)

  def test_bundled_checkpoint_converts_and_validates(self):
    out = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "converter", "main.py"), f"--hf_model_path={BUNDLED}",
         f"--output_dir={out}", "--simulated_cpu_devices_count=1"],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO), check=False,
    )
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn("leaves:        14 (scanned, bfloat16)", result.stdout)
    report = validate_lib.validate(BUNDLED, os.path.join(out, "0", "items"))
    self.assertEqual(report.failures(validate_lib.Thresholds()), [], report)


if __name__ == "__main__":
  absltest.main()
