"""The leaf handlers: registered beside Orbax's own without evicting them, carrying their write options into the
save, and recording LazyTensor leaves as "np.ndarray" and ShardedLazyTensor leaves as "jax.Array" so that stock
readers restore both."""

import json
import os
import tempfile
from unittest import mock

import jax

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 2)

import ml_dtypes  # pylint: disable=g-import-not-at-top,g-bad-import-order
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts
from absl.testing import absltest

from handlers import (  # pylint: disable=g-import-not-at-top
    ITEMS, JAX_ARRAY_TYPESTR, NUMPY_TYPESTR, BlockWritten, LazyTensor, LazyTensorLeafHandler, Processes,
    ShardedLazyTensor, ShardedLazyTensorLeafHandler, WriteOptions, add_lazy_tensor_leaf_handler, lazy_tensor_context,
)
from handlers import _orbax_private, claims


class _Rows:
  """A loader that computes `rows` rows at a time: the writer's blocks follow it under a small budget."""

  def __init__(self, value: np.ndarray, rows: int):
    self.value = value
    self.block_shape = (rows,) + value.shape[1:]

  def __call__(self) -> np.ndarray:
    return self.value

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    return self.value[index]


class _RowsLookingFor(_Rows):
  """`_Rows` that records, at each read, whether a directory named `name` exists anywhere under `root`."""

  def __init__(self, value: np.ndarray, rows: int, root: str, name: str):
    super().__init__(value, rows)
    self.root, self.name, self.seen = root, name, []

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    self.seen.append(any(self.name in dirs for _, dirs, _ in os.walk(self.root)))
    return super().region(index)


class RegistrationTest(absltest.TestCase):

  def test_lazy_tensors_get_our_handlers_with_the_options_baked_in(self):
    options = WriteOptions(max_inflight_bytes=1234, compression=False)
    registry = add_lazy_tensor_leaf_handler(_orbax_private.StandardLeafHandlerRegistry(), options)
    numpy_handler, sharded_handler = registry.get(LazyTensor), registry.get(ShardedLazyTensor)
    self.assertTrue(issubclass(numpy_handler, LazyTensorLeafHandler))
    self.assertTrue(issubclass(sharded_handler, ShardedLazyTensorLeafHandler))
    # Orbax instantiates handler classes itself, so the options must travel on the class.
    self.assertEqual((numpy_handler.write_options, sharded_handler.write_options), (options, options))
    self.assertEqual(LazyTensorLeafHandler.write_options, WriteOptions())  # The base class is left alone.
    self.assertEqual(registry.get_secondary_typestrs(numpy_handler), [NUMPY_TYPESTR])
    self.assertEqual(registry.get_secondary_typestrs(sharded_handler), [JAX_ARRAY_TYPESTR])

  def test_default_options_register_the_classes_themselves(self):
    registry = add_lazy_tensor_leaf_handler(_orbax_private.StandardLeafHandlerRegistry())
    self.assertIs(registry.get(LazyTensor), LazyTensorLeafHandler)
    self.assertIs(registry.get(ShardedLazyTensor), ShardedLazyTensorLeafHandler)

  def test_orbax_handlers_for_plain_arrays_stay(self):
    registry = add_lazy_tensor_leaf_handler(_orbax_private.StandardLeafHandlerRegistry())
    self.assertIs(registry.get(np.ndarray), _orbax_private.NumpyLeafHandler)
    self.assertIs(registry.get(jax.Array), _orbax_private.ArrayLeafHandler)


class SaveTest(absltest.TestCase):
  """Both leaf kinds saved through the handlers in one checkpoint, block by block, and read back by stock Orbax."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    rng = np.random.default_rng(0)
    cls.plain = rng.standard_normal((12, 8)).astype(ml_dtypes.bfloat16)
    cls.sharded = rng.standard_normal((8, 6)).astype(np.float32)
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("devices",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("devices"))
    cls.out = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    cls.sharded_loader = _RowsLookingFor(cls.sharded, 2, cls.out, "array_metadatas")
    tree = {"step": 0, "opt_state": {}, "params": {"params": {
        "plain": LazyTensor("plain", cls.plain.shape, cls.plain.dtype, _Rows(cls.plain, 3)),
        "sharded": ShardedLazyTensor("sharded", cls.sharded.shape, cls.sharded.dtype, cls.sharded_loader,
                                     sharding),
    }}}
    cls.written: list[BlockWritten] = []
    # Room for 4 blocks of 3 rows: the budget keeps every block at the loader's own size.
    options = WriteOptions(max_inflight_bytes=4 * 3 * 8 * 2, on_block_written=cls.written.append)
    checkpointer = ocp.v1.training.Checkpointer(cls.out, context=lazy_tensor_context(options))
    checkpointer.save_checkpointables(0, {ITEMS: tree})
    checkpointer.close()
    cls.items = os.path.join(cls.out, "0", ITEMS)

  def test_every_block_is_written_once_and_reported(self):
    by_leaf = {}
    for block in self.written:
      by_leaf.setdefault(block.array_name, []).append((block.start, block.stop, block.nbytes))
    self.assertEqual(sorted(by_leaf["params.params.plain"]), [((r, 0), (r + 3, 8), 3 * 8 * 2) for r in range(0, 12, 3)])
    self.assertEqual(sorted(by_leaf["params.params.sharded"]), [((r, 0), (r + 2, 6), 2 * 6 * 4) for r in range(0, 8, 2)])

  def test_leaves_are_recorded_as_plain_arrays(self):
    with open(os.path.join(self.items, "_METADATA")) as f:
      tree = json.load(f)["tree_metadata"]
    types = {key: entry["value_metadata"]["value_type"] for key, entry in tree.items()}
    self.assertEqual(types["('params', 'params', 'plain')"], NUMPY_TYPESTR)
    self.assertEqual(types["('params', 'params', 'sharded')"], JAX_ARRAY_TYPESTR)

  def test_stock_orbax_restores_the_values(self):
    checkpointer = ocp.PyTreeCheckpointer()
    metadata = checkpointer.metadata(self.items).item_metadata.tree
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
    restored = checkpointer.restore(self.items, restore_args=restore_args)["params"]["params"]
    for name, expected in (("plain", self.plain), ("sharded", self.sharded)):
      self.assertEqual(restored[name].dtype, expected.dtype, name)
      self.assertEqual(restored[name].tobytes(), expected.tobytes(), name)

  def test_the_array_metadata_directory_exists_before_the_first_block(self):
    # The other processes of a multi-process save poll for it once their share is written (every 0.25 s).
    self.assertNotEmpty(self.sharded_loader.seen)
    self.assertTrue(all(self.sharded_loader.seen), self.sharded_loader.seen)
    self.assertTrue(os.path.isfile(os.path.join(self.items, "array_metadatas", "process_0")))

  def test_the_sharded_leaf_records_its_sharding(self):
    with open(os.path.join(self.items, "_sharding")) as f:
      shardings = json.load(f)
    self.assertLen(shardings, 1)  # Only the jax.Array leaf has one.
    self.assertIn('"devices"', next(iter(shardings.values())))


class _OthersHold:
  """Claims as process 0 of 2 makes them when process 1 already holds `units` of its own share."""

  def __init__(self, units: set[int]):
    self.units = units

  def claim(self, share: str, owner: int, unit: int) -> int:
    del share
    return 1 if owner == 1 and unit in self.units else 0


class TakeOverTest(absltest.TestCase):
  """Process 0 of 2, once its own share is written, writes what process 1 has not started of its share: here
  24 rows in blocks of 3, each block a unit, rows 12 to 23 process 1's share."""

  def _save(self, held: set[int]) -> list[int]:
    value = np.arange(24 * 8, dtype=np.float32).reshape(24, 8)
    tree = {"params": {"x": LazyTensor("x", value.shape, value.dtype, _Rows(value, 3))}}
    written: list[BlockWritten] = []
    options = WriteOptions(max_inflight_bytes=4 * 3 * 8 * 4, on_block_written=written.append,
                           processes=Processes(index=0, count=2), claims=_OthersHold(held))
    out = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    checkpointer = ocp.v1.training.Checkpointer(out, context=lazy_tensor_context(options))
    with mock.patch.object(claims, "UNIT_BYTES", 1):
      checkpointer.save_checkpointables(0, {ITEMS: tree})
    checkpointer.close()
    stored = ts.open({"driver": "zarr3", "kvstore": {"driver": "ocdbt", "base": f"file://{out}/0/{ITEMS}/",
                                                      "path": "params.x/"}}).result()
    rows = sorted(b.start[0] for b in written)
    for row in rows:  # Process 1's blocks are missing: only this process's are read back.
      np.testing.assert_array_equal(stored[row:row + 3].read().result(), value[row:row + 3])
    return rows

  def test_a_share_nobody_started_is_taken_over_but_its_first_unit(self):
    self.assertEqual(self._save(held=set()), [0, 3, 6, 9, 15, 18, 21])

  def test_what_its_owner_started_is_left_to_it(self):
    self.assertEqual(self._save(held={0, 1, 2}), [0, 3, 6, 9, 21])


if __name__ == "__main__":
  absltest.main()
