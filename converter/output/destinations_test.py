"""An output path gets the kind of storage that commits and locks it correctly: a bucket prefix never gets a local
disk's rename-based commit and flock, nor a local directory a bucket's commit file and leased lock object."""

import os
import tempfile

from absl.testing import absltest

from converter.output.bucket import Bucket
from converter.output.destinations import destination_for
from converter.output.local import LocalDisk


class DestinationForTest(absltest.TestCase):

  def test_a_bucket_path_is_a_bucket(self):
    destination = destination_for("gs://ckpts/run/out")
    self.assertIsInstance(destination, Bucket)
    self.assertEqual(destination.path, "gs://ckpts/run/out")

  def test_a_local_path_is_a_local_disk(self):
    path = os.path.join(tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir()), "out")
    destination = destination_for(path)
    self.assertIsInstance(destination, LocalDisk)
    self.assertEqual(destination.path, path)


if __name__ == "__main__":
  absltest.main()
