"""Write blocks and the stored grid: blocks tile the array; at N devices they stay inside device shards."""

import jax

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 16)

import dataclasses  # pylint: disable=g-import-not-at-top,g-bad-import-order

import numpy as np  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top

from handlers import LazyTensor, ShardedLazyTensor  # pylint: disable=g-import-not-at-top
from handlers.streaming import write_block_shape, write_shape  # pylint: disable=g-import-not-at-top


@dataclasses.dataclass(frozen=True)
class RowSlabs:
  """A loader that reads any run of rows (like a plan's slab loader), in natural blocks of `rows`."""

  shape: tuple[int, ...]
  rows: int

  @property
  def block_shape(self):
    return (self.rows,) + self.shape[1:]

  def region(self, index):
    return np.zeros(tuple(s.stop - s.start for s in index), np.float32)


def _sharded(shape, loader, axis=0):
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("devices",))
  spec = [None] * len(shape)
  spec[axis] = "devices"
  return ShardedLazyTensor("t", shape, np.float32, loader,
                           jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec)))


class StreamingTest(absltest.TestCase):

  def test_slabs_are_cut_at_device_shards(self):
    # 16384 rows over 16 devices: 1024 a device. A 4681-row slab would give a one-row stored grid (gcd).
    lazy = _sharded((16384, 8), RowSlabs((16384, 8), 4681))
    block = write_block_shape(lazy, 1 << 30)
    self.assertEqual(block, (4096, 8))
    self.assertEqual(write_shape(lazy, block), (1024, 8))

  def test_a_slab_smaller_than_a_shard_becomes_a_divisor_of_it(self):
    lazy = _sharded((151936, 4), RowSlabs((151936, 4), 5000))  # 9496 rows a device = 8 x 1187.
    self.assertEqual(write_block_shape(lazy, 1 << 30), (4748, 4))

  def test_unsharded_axes_keep_their_block(self):
    # Sharded on axis 0; the slab axis 1 is whole on every device: the grid keeps the slab, short last block.
    loader = RowSlabs((448 * 16, 16384), 4681)
    lazy = _sharded((448 * 16, 16384), loader)
    self.assertEqual(write_shape(lazy, (7168, 4681)), (448, 4681))

  def test_unsharded_tensors_are_unchanged(self):
    lazy = LazyTensor("t", (16384, 8), np.float32, RowSlabs((16384, 8), 4681))
    self.assertEqual(write_block_shape(lazy, 1 << 30), (4681, 8))


if __name__ == "__main__":
  absltest.main()
