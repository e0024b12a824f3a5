"""orbax_format against Orbax itself: the read specs equal `get_json_tspec_read`'s for every storage kind, the
tree equals `PyTreeCheckpointHandler.metadata`'s, and checkpoints Orbax wrote with and without OCDBT, in zarr3
and zarr v2, read back through CheckpointReader with their values."""

import os
import shutil
import tempfile

import jax

jax.config.update("jax_platforms", "cpu")

import numpy as np  # pylint: disable=g-import-not-at-top,g-bad-import-order
import orbax.checkpoint as ocp
from absl.testing import absltest, parameterized
from etils import epath

from converter.sources import orbax_format
from converter.sources.checkpoint_reader import CheckpointReader
from converter.errors import ConversionError


def _orbax_spec(items_path: str, name: str, use_zarr3: bool, use_ocdbt: bool) -> dict:
  info = ocp.type_handlers.ParamInfo(name=name, parent_dir=epath.Path(items_path), use_zarr3=use_zarr3,
                                     is_ocdbt_checkpoint=use_ocdbt)
  return ocp.type_handlers.get_json_tspec_read(info, use_ocdbt=use_ocdbt)


def _save(tree: dict, use_ocdbt: bool, use_zarr3: bool) -> str:
  items = os.path.join(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")), "items")
  handler = ocp.PyTreeCheckpointHandler(use_ocdbt=use_ocdbt, use_zarr3=use_zarr3)
  with ocp.Checkpointer(handler) as checkpointer:
    checkpointer.save(items, args=ocp.args.PyTreeSave(tree))
  return items


def _tree(seed: int) -> dict:
  rng = np.random.default_rng(seed)
  return {"step": 7, "opt_state": {},
          "params": {"params": {"decoder": {"layers": [rng.standard_normal((3, 4 + i)).astype(np.float32)
                                                       for i in range(11)],
                                            "norm": {"scale": rng.standard_normal(5).astype(np.float32)}},
                                "token_embedder": {"embedding": rng.standard_normal((9, 2)).astype(np.float32)}}}}


class ReadSpecTest(parameterized.TestCase):

  @parameterized.product(items_path=("/ckpt/run/0/items", "/ckpt/run/0/items/", "gs://bucket/run/0/items",
                                     "gs://bucket/items/"),
                         use_zarr3=(True, False), use_ocdbt=(True, False))
  def test_equals_orbax_own(self, items_path, use_zarr3, use_ocdbt):
    name = "params.params.decoder.layers.mlp.wi_0.kernel"
    self.assertEqual(orbax_format.array_read_spec(items_path, name, use_zarr3, use_ocdbt),
                     _orbax_spec(items_path, name, use_zarr3, use_ocdbt))

  def test_a_relative_path_is_refused(self):
    with self.assertRaisesRegex(ConversionError, "must be absolute"):
      orbax_format.array_read_spec("run/0/items", "a", True, True)


class TreeLayoutTest(parameterized.TestCase):

  @parameterized.parameters((True, True), (False, False), (True, False))
  def test_leaves_and_values_equal_orbax_own(self, use_ocdbt, use_zarr3):
    tree = _tree(0)
    items = _save(tree, use_ocdbt, use_zarr3)
    layout = orbax_format.read_tree_layout(items)
    self.assertEqual((layout.use_ocdbt, layout.use_zarr3), (use_ocdbt, use_zarr3))

    metadata = ocp.PyTreeCheckpointHandler().metadata(epath.Path(items)).tree
    arrays = {tuple(str(getattr(k, "key", getattr(k, "idx", None))) for k in path): leaf
              for path, leaf in jax.tree_util.tree_flatten_with_path(metadata)[0]
              if getattr(leaf, "shape", ())}
    self.assertEqual(layout.array_paths, list(arrays))  # Same leaves, same order (layers 0, 1, ..., 10).
    self.assertEqual(layout.array_paths[1], ("params", "params", "decoder", "layers", "1"))

    reader = CheckpointReader(items)
    self.assertEqual(list(reader.arrays), list(arrays))
    for path, leaf in arrays.items():
      stored = reader.arrays[path]
      self.assertEqual((stored.name, stored.shape, stored.dtype), (leaf.name, tuple(leaf.shape), leaf.dtype))
    layers = tree["params"]["params"]["decoder"]["layers"]
    for i in (0, 10):
      opened = reader.open(reader.arrays[("params", "params", "decoder", "layers", str(i))], (), 1 << 20)
      np.testing.assert_array_equal(opened.read(()), layers[i])

  def test_foreign_metadata_is_refused_with_its_path(self):
    items = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    with open(os.path.join(items, "_METADATA"), "w") as f:
      f.write('{"tree_metadata": {"(\'a\',)": {"value_metadata": {}}}}')
    with self.assertRaisesRegex(ConversionError, f"{items}/_METADATA: not the metadata of an Orbax PyTree"):
      orbax_format.read_tree_layout(items)

  def test_a_listed_array_missing_from_the_store_names_the_leaf(self):
    items = _save(_tree(1), use_ocdbt=False, use_zarr3=True)
    shutil.rmtree(os.path.join(items, "params.params.token_embedder.embedding"))
    with self.assertRaisesRegex(ConversionError, f"{items}: cannot open leaf params/params/token_embedder/embedding"):
      CheckpointReader(items)


if __name__ == "__main__":
  absltest.main()
