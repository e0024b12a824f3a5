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



class UncommittedTest(absltest.TestCase):
  """A step is finished as Orbax decides it: locally by its name (renamed from the temporary directory), in a
  bucket by commit_success.txt in it."""

  def test_local_steps_are_judged_by_their_names(self):
    root = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    self.assertIsNone(layout.uncommitted_reason(os.path.join(root, "0", "items")))  # No marker needed (old Orbax).
    self.assertIsNone(layout.uncommitted_reason(os.path.join(root, "3", "model_params")))
    tmp = os.path.join(root, "0.orbax-checkpoint-tmp-1765000000")
    self.assertIn(f"{tmp} is the temporary directory", layout.uncommitted_reason(os.path.join(tmp, "items")))
    self.assertIn(f"{tmp} is the temporary", layout.uncommitted_reason(tmp))

  def test_bucket_steps_need_their_commit_marker(self):
    present: set[str] = set()
    with absltest.mock.patch.object(layout.storage, "exists", lambda path: path in present):
      reason = layout.uncommitted_reason("gs://b/run/7/items")
      self.assertIn("neither gs://b/run/7 nor gs://b/run/7/items holds commit_success.txt", reason)
      present.add("gs://b/run/7/commit_success.txt")  # Orbax's CheckpointManager: in the step.
      self.assertIsNone(layout.uncommitted_reason("gs://b/run/7/items"))
      present.clear()
      present.add("gs://b/ckpt/commit_success.txt")  # A Checkpointer saving straight into the directory.
      self.assertIsNone(layout.uncommitted_reason("gs://b/ckpt"))


if __name__ == "__main__":
  absltest.main()
