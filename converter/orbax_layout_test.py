"""Where Orbax puts a step's pieces, local and in buckets."""

import os
import tempfile

from absl.testing import absltest

from converter import orbax_layout


class LayoutTest(absltest.TestCase):

  def test_paths(self):
    self.assertEqual(orbax_layout.items_path("gs://b/out"), "gs://b/out/0/items")
    self.assertEqual(orbax_layout.metadata_path("gs://b/out/0/items"), "gs://b/out/0/_CHECKPOINT_METADATA")
    self.assertEqual(orbax_layout.process_database("/o/0/items", 3), "/o/0/items/ocdbt.process_3")
    self.assertEqual(orbax_layout.kvstore_base("/o/0"), "file:///o/0")
    self.assertEqual(orbax_layout.kvstore_base("gs://b/o/0"), "gs://b/o/0")

  def test_local_unfinished_and_committed(self):
    out = tempfile.mkdtemp()
    self.assertFalse(orbax_layout.is_committed(out))
    os.makedirs(os.path.join(out, "0.orbax-checkpoint-tmp-1234"))
    self.assertEqual(orbax_layout.unfinished_paths(out), [os.path.join(out, "0.orbax-checkpoint-tmp-1234")])
    self.assertFalse(orbax_layout.is_committed(out))
    os.makedirs(os.path.join(out, "0"))
    self.assertTrue(orbax_layout.is_committed(out))


if __name__ == "__main__":
  absltest.main()
