"""Where Orbax puts a step's pieces, local and in buckets."""

from absl.testing import absltest

from converter.output import layout


class LayoutTest(absltest.TestCase):

  def test_paths(self):
    self.assertEqual(layout.items_path("gs://b/out"), "gs://b/out/0/items")
    self.assertEqual(layout.metadata_path("gs://b/out/0/items"), "gs://b/out/0/_CHECKPOINT_METADATA")
    self.assertEqual(layout.process_database("/o/0/items", 3), "/o/0/items/ocdbt.process_3")
    self.assertEqual(layout.kvstore_base("/o/0"), "file:///o/0")
    self.assertEqual(layout.kvstore_base("gs://b/o/0"), "gs://b/o/0")


if __name__ == "__main__":
  absltest.main()
