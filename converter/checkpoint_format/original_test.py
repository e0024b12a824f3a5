"""Where the original model lives, as the record keeps it: a Hub snapshot in the local cache is its repo at its
commit, any other directory (or bucket prefix) itself, and a record of either reads back as it was written."""

from absl.testing import absltest

from converter.checkpoint_format.original import Original

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class OriginalTest(absltest.TestCase):

  def test_a_hub_snapshot_is_its_repo_at_its_commit(self):
    snapshot = f"/root/.cache/huggingface/hub/models--Qwen--Qwen3-8B/snapshots/{COMMIT}"
    original = Original.of_directory(snapshot)
    self.assertEqual(original, Original("Qwen/Qwen3-8B", COMMIT))
    self.assertTrue(original.on_hub)
    self.assertEqual(original.describe(), f"Qwen/Qwen3-8B (revision {COMMIT})")

  def test_another_directory_or_bucket_is_itself(self):
    for directory in ("/models/qwen3-8b", "gs://bucket/models/qwen3-8b", f"/models/snapshots/{COMMIT}"):
      original = Original.of_directory(directory)
      self.assertEqual((original.location, original.revision, original.on_hub), (directory, None, False))

  def test_a_record_reads_back_and_a_malformed_one_is_none(self):
    for original in (Original("Qwen/Qwen3-8B", COMMIT), Original("/models/qwen3-8b")):
      self.assertEqual(Original.of_record(original.record()), original)
    for entry in (None, "Qwen/Qwen3-8B", {"revision": COMMIT}, {"location": 3}):
      self.assertIsNone(Original.of_record(entry))


if __name__ == "__main__":
  absltest.main()
