"""A plan's leaves as lazy tensors: one device or a sharded mesh, lazy or materialised, the same values."""

import jax

jax.config.update("jax_num_cpu_devices", 4)

import numpy as np  # pylint: disable=g-import-not-at-top,g-bad-import-order
from absl.testing import absltest  # pylint: disable=g-import-not-at-top

from converter import conversion  # pylint: disable=g-import-not-at-top
from converter.planning import lazy_leaves
from converter.errors import ConversionError  # pylint: disable=g-import-not-at-top
from converter.options import PlanOptions  # pylint: disable=g-import-not-at-top
from handlers import LazyTensor, Processes, ShardedLazyTensor  # pylint: disable=g-import-not-at-top
from handlers.blocks import block_target_bytes, blocks_in_order, write_order  # pylint: disable=g-import-not-at-top


class LazyLeavesTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.plan = conversion.plan_conversion("testdata/tiny-qwen3", PlanOptions(save_dtype="float32"))

  def _leaves(self, tree):
    """The tree's values in the plan's order of leaves."""
    values = []
    for leaf in self.plan.leaves:
      node = tree["params"]["params"]
      for key in leaf.path:
        node = node[key]
      values.append(node)
    return values

  def test_one_device_lazy_and_eager_hold_the_same_values(self):
    lazy = self._leaves(lazy_leaves.lazy_tree(self.plan, lazy=True, devices=1, processes=Processes()))
    eager = self._leaves(lazy_leaves.lazy_tree(self.plan, lazy=False, devices=1, processes=Processes()))
    self.assertTrue(all(isinstance(v, LazyTensor) for v in lazy))
    self.assertTrue(all(isinstance(v, np.ndarray) for v in eager))
    for value, array in zip(lazy, eager):
      np.testing.assert_array_equal(value.materialize(), array)

  def test_a_mesh_shards_the_first_axis_the_devices_divide(self):
    tree = lazy_leaves.lazy_tree(self.plan, lazy=True, devices=4, processes=Processes())
    leaves = {leaf.name: value for leaf, value in zip(self.plan.leaves, self._leaves(tree))}
    self.assertTrue(all(isinstance(v, ShardedLazyTensor) for v in leaves.values()))
    embedding = leaves["token_embedder/embedding"]  # (257, 64): 257 is prime, 64 divides by 4.
    self.assertEqual(tuple(embedding.sharding.spec), (None, "devices"))
    eager = self._leaves(lazy_leaves.lazy_tree(self.plan, lazy=False, devices=4, processes=Processes()))
    for value, array in zip(leaves.values(), eager):
      self.assertEqual(array.sharding, value.sharding)
      np.testing.assert_array_equal(value.materialize(), np.asarray(array))

  def test_the_early_reads_cut_the_leaves_as_the_tree_does_without_jax(self):
    for devices in (1, 4):
      tree = lazy_leaves.lazy_tree(self.plan, lazy=True, devices=devices, processes=Processes())
      by_name = {value.name: value for value in self._leaves(tree)}
      early = lazy_leaves.read_early(self.plan, devices=devices, max_inflight_bytes=1 << 20)
      self.assertTrue(early.join(30))
      writing = [by_name[lazy_leaves.lazy_tensor(leaf).name] for leaf in lazy_leaves.in_writing_order(self.plan)]
      in_tree = [v for v in jax.tree_util.tree_leaves(tree) if isinstance(v, LazyTensor)]  # Orbax's order.
      self.assertEqual([v.name for v in writing], [in_tree[i].name for i in write_order([v.nbytes for v in in_tree])])
      self.assertNotEqual([v.name for v in writing], [v.name for v in in_tree])  # The order is the writer's own.
      cut = [(lazy.name, tuple((s.start, s.stop) for s in index))
             for lazy, index, _ in blocks_in_order(writing, block_target_bytes(1 << 20))]
      taken = [early.take(name, tuple(slice(*bounds) for bounds in index)) for name, index in cut]
      self.assertTrue(all(taken), devices)  # Every block the tree's writer asks for was read early, ...
      self.assertEqual(early.taken_bytes, early.read_bytes)  # ... and nothing else.
      for (name, index), block in zip(cut, taken):
        np.testing.assert_array_equal(block.result(), by_name[name].read(tuple(slice(*b) for b in index)))
    shards = lazy_leaves._DeviceShards(4)  # pylint: disable=protected-access
    for value in by_name.values():
      self.assertEqual(shards.shard_shape(value.shape), value.sharding.shard_shape(value.shape), value.name)

  def test_the_name_carries_the_sources(self):
    leaf = self.plan.leaves[0]
    self.assertEqual(lazy_leaves.lazy_tensor(leaf).name, f"{leaf.name} (from {leaf.sources[0]})")

  def test_several_processes_write_lazily_only(self):
    with self.assertRaisesRegex(ConversionError, "several processes write lazily only"):
      lazy_leaves.lazy_tree(self.plan, lazy=False, devices=1, processes=Processes(index=0, count=2))


if __name__ == "__main__":
  absltest.main()
