"""Where Orbax puts a step's pieces, local and in buckets; a checkpoint path resolved to its items."""

import os
import tempfile

from absl.testing import absltest

from converter.checkpoint_format import layout
from converter.errors import ConversionError


def _step_holding(*names: str) -> str:
  """A step directory OUT/2 whose subdirectories `names` each hold a tree's _METADATA."""
  step = os.path.join(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")), "2")
  for name in names:
    os.makedirs(os.path.join(step, name))
    with open(os.path.join(step, name, layout.TREE_METADATA), "w") as f:
      f.write("{}")
  return step


class LayoutTest(absltest.TestCase):

  def test_paths(self):
    self.assertEqual(layout.items_path("gs://b/out"), "gs://b/out/0/items")
    self.assertEqual(layout.metadata_path("gs://b/out/0/items"), "gs://b/out/0/_CHECKPOINT_METADATA")
    self.assertEqual(layout.process_database("/o/0/items", 3), "/o/0/items/ocdbt.process_3")
    self.assertEqual(layout.kvstore_base("/o/0"), "file:///o/0")
    self.assertEqual(layout.kvstore_base("gs://b/o/0"), "gs://b/o/0")


class ItemsPathTest(absltest.TestCase):

  def test_a_tunix_step_directory_resolves_to_its_model_params(self):
    step = _step_holding("model_params", "optimizer_state")
    self.assertEqual(layout.items_path_of(step), os.path.join(step, "model_params"))

  def test_a_step_directory_resolves_to_its_items(self):
    step = _step_holding("items")
    self.assertEqual(layout.items_path_of(step), os.path.join(step, "items"))
    self.assertEqual(layout.items_path_of(os.path.join(step, "items")), os.path.join(step, "items"))

  def test_a_missing_directory_is_named(self):
    missing = os.path.join(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")), "nothing")
    with self.assertRaisesRegex(ConversionError, f"{missing}: no such checkpoint directory"):
      layout.items_path_of(missing)


if __name__ == "__main__":
  absltest.main()
