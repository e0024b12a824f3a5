"""A bucket output against a real GCS endpoint on 127.0.0.1 (fake-gcs-server, started and stopped here): a step is
finished only with its commit file, the journal is a series of objects, the lock is an object with a lease, and
an HF output is replaced only with --overwrite."""

import json
import os

from absl.testing import absltest

from converter import storage
from converter.errors import ConversionError
from converter.output import lock as lock_lib
from converter.output.bucket import Bucket, BucketJournal
from handlers import BlockWritten
from tools.gcs_emulator import GcsEmulator


class BucketTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.gcs = GcsEmulator()
    cls.gcs.start()
    cls.addClassCleanup(cls.gcs.stop)
    cls.gcs.create_bucket("ckpts")
    cls._environ = dict(os.environ)
    os.environ.update(cls.gcs.env)
    storage.configure_emulator()
    storage.set_request_retries(0)  # A test that fails should fail now, not after three minutes of retries.

  @classmethod
  def tearDownClass(cls):
    os.environ.clear()
    os.environ.update(cls._environ)
    super().tearDownClass()

  def test_a_step_is_finished_only_with_its_commit_file(self):
    bucket = Bucket("gs://ckpts/steps")
    self.assertEqual(bucket.unfinished_steps(), [])
    storage.write_text("gs://ckpts/steps/0/items/_METADATA", "{}")
    self.assertEqual(bucket.unfinished_steps(), ["gs://ckpts/steps/0"])
    self.assertFalse(bucket.has_committed_step())
    storage.write_text("gs://ckpts/steps/0/commit_success.txt", "")
    self.assertTrue(bucket.has_committed_step())
    self.assertEqual(bucket.unfinished_steps(), [])

  def test_the_journal_is_a_series_of_objects_each_a_run_of_entries(self):
    journal = BucketJournal("gs://ckpts/journal/gen-0.journal")
    journal(BlockWritten("params.params.a", (0,), (2,), 8))
    journal(BlockWritten("params.params.b", (2, 0), (4, 3), 24))
    journal.close()
    names = self.gcs.object_names("ckpts", "journal/")
    self.assertNotEqual(names, [])
    self.assertTrue(all(n.startswith("journal/gen-0.journal.") for n in names), names)
    lines = [json.loads(line) for name in sorted(names)
             for line in self.gcs.download("ckpts", name).decode().splitlines()]
    self.assertEqual(lines, [{"a": "params.params.a", "s": [0], "e": [2]},
                             {"a": "params.params.b", "s": [2, 0], "e": [4, 3]}])

  def test_a_second_lock_is_refused_naming_the_holder_and_released_after(self):
    path = lock_lib.lock_path("gs://ckpts/locked")
    first = Bucket("gs://ckpts/locked").lock(path, lease_s=60, on_lost=None)
    first.acquire()
    try:
      second = Bucket("gs://ckpts/locked").lock(path, lease_s=60, on_lost=None)
      with self.assertRaisesRegex(ConversionError, f"gs://ckpts/locked: another conversion is writing there \\(pid"
                                                   f" {os.getpid()}"):
        second.acquire()
    finally:
      first.release()
    self.assertFalse(storage.exists(path))

  def test_an_hf_output_is_replaced_only_with_overwrite(self):
    bucket = Bucket("gs://ckpts/hf")
    storage.write_text("gs://ckpts/hf/config.json", "{}")
    with self.assertRaisesRegex(ConversionError, "gs://ckpts/hf: already exists and is not empty"):
      bucket.stage(overwrite=False, shared=False)
    self.assertEqual(bucket.stage(overwrite=True, shared=False), "gs://ckpts/hf")
    self.assertEqual(storage.list_names("gs://ckpts/hf"), [])
    self.assertEqual(bucket.shared_staging(), "gs://ckpts/hf")


if __name__ == "__main__":
  absltest.main()
