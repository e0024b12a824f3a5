"""The HF output: published whole (shards first, the last files after), or nothing left when writing fails."""

import os
import tempfile

from absl.testing import absltest

from converter.errors import ConversionError
from converter.options import RunContext
from converter.output.huggingface import HuggingFaceOutput


def _parent() -> str:
  return tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())


class HuggingFaceOutputTest(absltest.TestCase):

  def test_shards_then_last_files_are_published_together(self):
    output_dir = os.path.join(_parent(), "out")
    seen = []

    def write_shards(directory: str, finished) -> None:
      seen.append(sorted(os.listdir(directory)))
      with open(os.path.join(directory, "model.safetensors"), "wb") as f:
        f.write(b"shard")
      finished(os.path.join(directory, "model.safetensors"))  # A local disk publishes it with the rest.

    HuggingFaceOutput(output_dir, RunContext()).write(write_shards, lambda: {"config.json": "{}\n"})
    self.assertEqual(seen, [[]])  # Written into a fresh staging directory, not the output.
    self.assertEqual(sorted(os.listdir(output_dir)), ["config.json", "model.safetensors"])
    self.assertEqual(os.listdir(os.path.dirname(output_dir)), ["out"])  # No staging or lock left beside it.

  def test_a_failed_write_leaves_nothing_and_names_the_output(self):
    output_dir = os.path.join(_parent(), "out")

    def write_shards(directory: str, finished) -> None:
      del finished
      with open(os.path.join(directory, "model.safetensors"), "wb") as f:
        f.write(b"half")
      raise OSError(28, "No space left on device")

    with self.assertRaisesRegex(ConversionError, f"{output_dir}: writing the HF checkpoint failed: .*No space left"):
      HuggingFaceOutput(output_dir, RunContext()).write(write_shards, lambda: {"config.json": "{}\n"})
    self.assertEqual(os.listdir(os.path.dirname(output_dir)), [])

  def test_an_existing_output_is_kept_until_the_new_one_is_whole(self):
    output_dir = os.path.join(_parent(), "out")
    os.makedirs(output_dir)
    with open(os.path.join(output_dir, "config.json"), "w") as f:
      f.write("old")
    with self.assertRaisesRegex(ConversionError, "pass --overwrite"):
      HuggingFaceOutput(output_dir, RunContext()).write(lambda d, finished: None, dict)

    def fail(directory: str, finished) -> None:
      raise ConversionError("a leaf is damaged")

    with self.assertRaisesRegex(ConversionError, "a leaf is damaged"):
      HuggingFaceOutput(output_dir, RunContext(overwrite=True)).write(fail, dict)
    with open(os.path.join(output_dir, "config.json")) as f:
      self.assertEqual(f.read(), "old")


if __name__ == "__main__":
  absltest.main()
