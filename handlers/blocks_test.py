"""Write blocks and the stored grid: blocks tile the array; at N devices they stay inside device shards."""

import jax

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 16)

import dataclasses  # pylint: disable=g-import-not-at-top,g-bad-import-order

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorstore as ts  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top

from handlers import LazyTensor, ShardedLazyTensor  # pylint: disable=g-import-not-at-top
from handlers import _orbax_private  # pylint: disable=g-import-not-at-top
from handlers.blocks import (  # pylint: disable=g-import-not-at-top
    TARGET_BLOCK_BYTES, HostGroup, blocks_in_order, host_group, host_parts, inner_chunk_shape, plan_blocks,
    write_block_shape, write_order, write_shape)


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


def _sharded(shape, loader, axis=0, chunk_shape=None):
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("devices",))
  spec = [None] * len(shape)
  spec[axis] = "devices"
  return ShardedLazyTensor("t", shape, np.float32, loader,
                           jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec)), chunk_shape)


class DeviceShardsTest(absltest.TestCase):

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

  def test_read_chunks_not_device_shards_cut_the_stored_grid(self):
    # A `wo` (mlp, embed) saved over 16 devices on mlp, chunked along embed: cut at the device shards too, each
    # stored block would be a 1.5 MB sliver, and a bucket restore (which merges one host's reads of one object up
    # to 1 MB apart) would fetch the other hosts' parts between them.
    lazy = _sharded((6144, 2048), RowSlabs((6144, 2048), 4096), chunk_shape=(6144, 32))
    block = write_block_shape(lazy, 16 << 20)
    self.assertEqual(write_shape(lazy, block), block)
    self.assertEqual(block, (3072, 2048))  # Whole chunk rows (a divisor of 6144), not 384-row device shards.

  def test_unsharded_tensors_are_unchanged(self):
    lazy = LazyTensor("t", (16384, 8), np.float32, RowSlabs((16384, 8), 4681))
    self.assertEqual(write_block_shape(lazy, 1 << 30), (4681, 8))


class ReadChunksTest(absltest.TestCase):
  """Read chunks (zarr3 inner chunks) inside the write blocks: blocks are cut to hold whole chunks."""

  def test_blocks_hold_whole_chunks(self):
    # A (6144, 2048) `wo` read in 16 MiB slabs of 1365 rows: cut to 1024 rows (a divisor of the 6144-row chunk).
    lazy = LazyTensor("wo", (6144, 2048), np.float16, RowSlabs((6144, 2048), 1365), chunk_shape=(6144, 32))
    block = write_block_shape(lazy)
    self.assertEqual(block, (1024, 2048))
    self.assertEqual(inner_chunk_shape(lazy, block), (1024, 32))
    # Blocks longer than a chunk are whole multiples of it.
    lazy = LazyTensor("wi", (2048, 6144), np.float16, RowSlabs((2048, 6144), 1365), chunk_shape=(32, 6144))
    self.assertEqual(write_block_shape(lazy), (1344, 6144))
    self.assertIsNone(inner_chunk_shape(LazyTensor("n", (8,), np.float32, lambda: np.zeros(8)), (8,)))

  def test_a_chunk_no_divisor_of_which_fits_keeps_the_block(self):
    # A prime vocabulary (151681 rows) whole in the chunk, read in slabs: one-row blocks would be 151681 writes.
    lazy = LazyTensor("embedding", (151681, 64), np.float32, RowSlabs((151681, 64), 4096), chunk_shape=(151681, 1))
    block = write_block_shape(lazy)
    self.assertEqual(block, (4096, 64))
    self.assertEqual(inner_chunk_shape(lazy, block), (4096, 1))

  def test_inner_chunks_go_into_orbax_zarr3_spec(self):
    spec = {"driver": "zarr3", "metadata": {"codecs": [{"name": "sharding_indexed", "configuration": {
        "chunk_shape": [1024, 2048], "codecs": [{"name": "bytes"}]}}]}}
    out = _orbax_private.with_inner_chunks(spec, (1024, 32))
    self.assertEqual(out["metadata"]["codecs"][0]["configuration"]["chunk_shape"], [1024, 32])
    self.assertEqual(spec["metadata"]["codecs"][0]["configuration"]["chunk_shape"], [1024, 2048])  # Not mutated.
    zarr2 = {"driver": "zarr", "metadata": {"chunks": [4, 4]}}
    self.assertIs(_orbax_private.with_inner_chunks(zarr2, (2, 2)), zarr2)

  def test_a_chunk_order_lays_each_block_out_with_that_axis_outermost(self):
    # A `wo` (mlp, layers, embed) block with embed first: one host's embed rows are one run of the block's bytes.
    metadata = {"shape": [12, 2, 16], "data_type": "float32",
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [12, 1, 16]}},
                "chunk_key_encoding": {"name": "default"},
                "codecs": [{"name": "sharding_indexed", "configuration": {
                    "chunk_shape": [12, 1, 16], "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}]}
    values = np.arange(12 * 2 * 16, dtype=np.float32).reshape(12, 2, 16)
    chunk_bytes = 6 * 4 * 4
    for element_order, first_chunk in ((None, values[:6, 0, :4]), ((1, 2, 0), values[:6, 0, :4].T)):
      spec = _orbax_private.with_inner_chunks(
          {"driver": "zarr3", "kvstore": {"driver": "memory"}, "metadata": metadata}, (6, 1, 4), (2, 0, 1),
          element_order)
      store = ts.open(spec, create=True).result()
      store.write(values).result()
      np.testing.assert_array_equal(store.read().result(), values)
      self.assertEqual(tuple(store.chunk_layout.read_chunk.shape), (6, 1, 4))
      self.assertEqual(tuple(store.chunk_layout.inner_order), element_order or (0, 1, 2))
      shards = sorted(key for key in store.kvstore.list().result() if key.startswith(b"c/"))
      self.assertEqual(shards, [b"c/0/0/0", b"c/0/1/0"])  # One value per layer, as without the order.
      block = store.kvstore.read(shards[0]).result().value
      # The block's first chunk, its elements in `element_order` (C order by default) ...
      np.testing.assert_array_equal(np.frombuffer(block[:chunk_bytes], np.float32), first_chunk.reshape(-1))
      # ... then the next mlp rows at the same embed columns: embed is the outermost axis of the chunk grid.
      second = np.frombuffer(block[chunk_bytes:2 * chunk_bytes], np.float32).reshape(first_chunk.shape)
      np.testing.assert_array_equal(second, first_chunk + 6 * 2 * 16)


@dataclasses.dataclass(frozen=True)
class LayerBlocks:
  """A loader of one layer at a time of an (embed, layers, mlp) leaf, as a scanned kernel's."""

  shape: tuple[int, ...]

  @property
  def block_shape(self):
    return (self.shape[0], 1, self.shape[2])

  def region(self, index):
    return np.zeros(tuple(s.stop - s.start for s in index), np.float32)


class HostPartsTest(absltest.TestCase):
  # A 64 MiB float32 kernel of 16 layers (4 MiB each) whose `embed` four restoring hosts hold a quarter of.
  SHAPE, HOST = (1024, 16, 1024), (256, 16, 1024)

  def _lazy(self) -> LazyTensor:
    return LazyTensor("t", self.SHAPE, np.float32, LayerBlocks(self.SHAPE), chunk_shape=(64, 16, 1024),
                      host_shape=self.HOST)

  def test_a_block_is_cut_into_each_hosts_piece(self):
    lazy = self._lazy()
    block = (slice(0, 1024), slice(4, 8), slice(0, 1024))
    self.assertEqual(host_parts(lazy, block), [
        (part, (slice(256 * part, 256 * part + 256), slice(4, 8), slice(0, 1024))) for part in range(4)])
    self.assertEqual(host_parts(LazyTensor("t", self.SHAPE, np.float32, LayerBlocks(self.SHAPE)), block),
                     [(0, block)])

  def test_stored_blocks_join_the_pieces_of_consecutive_blocks_up_to_a_write_block(self):
    lazy = self._lazy()
    block = write_block_shape(lazy)
    self.assertEqual(block, (1024, 4, 1024))  # 16 MiB: four layers, every host's part.
    self.assertEqual(write_shape(lazy, block), (256, 4, 1024))  # Each host's piece: 4 MiB.
    # Pieces of four blocks (16 MiB) in one stored block, where half the budget holds four blocks.
    self.assertEqual(host_group(lazy, block, 128 << 20), HostGroup((1, 4, 1), 4))
    self.assertEqual(write_shape(lazy, block, (1, 4, 1)), (256, 16, 1024))
    self.assertEqual(4 * 256 * 1024 * 4 * 4, TARGET_BLOCK_BYTES)
    self.assertEqual(host_group(lazy, block, 64 << 20), HostGroup((1, 2, 1), 2))  # Half the budget: two blocks.
    self.assertEqual(host_group(lazy, block, 32 << 20), HostGroup((1, 1, 1), 1))
    # Blocks that follow one another across the hosts' parts first (the parts cut the last axis here): a group
    # takes each row of them whole, its blocks' pieces going to different parts' stored blocks.
    last = LazyTensor("t", self.SHAPE, np.float32, LayerBlocks(self.SHAPE), host_shape=(1024, 16, 256))
    self.assertEqual(host_group(last, (1024, 4, 512), 128 << 20), HostGroup((1, 4, 1), 8))
    self.assertEqual(write_shape(last, (1024, 4, 512), (1, 4, 1)), (1024, 16, 256))
    self.assertEqual(host_group(last, (1024, 4, 512), 16 << 20), HostGroup((1, 1, 1), 1))  # No room for a row.
    # Nothing to join where the blocks follow one another only along an axis the hosts' parts cut.
    rows = LazyTensor("t", self.SHAPE, np.float32, RowSlabs(self.SHAPE, 256), chunk_shape=(64, 16, 1024),
                      host_shape=self.HOST)
    self.assertEqual(host_group(rows, (256, 16, 1024), 128 << 20), HostGroup((1, 1, 1), 1))
    self.assertEqual(host_group(LazyTensor("t", self.SHAPE, np.float32, LayerBlocks(self.SHAPE)), block, 1 << 30),
                     HostGroup((1, 1, 1), 1))

  def test_blocks_are_cut_at_the_hosts_parts(self):
    lazy = LazyTensor("t", self.SHAPE, np.float32, RowSlabs(self.SHAPE, 320), host_shape=self.HOST)
    self.assertEqual(write_block_shape(lazy)[0], 256)  # Not 320: a part's 256 rows, not pieces of 64.
    lazy = LazyTensor("t", self.SHAPE, np.float32, RowSlabs(self.SHAPE, 1000), host_shape=self.HOST)
    self.assertEqual(write_block_shape(lazy, 64 << 20)[0], 768)


class BlocksInOrderTest(absltest.TestCase):

  def test_the_same_blocks_in_the_same_order_as_plan_blocks(self):
    # What the early reads read first (handlers/early_reads.py) is what the writer asks for first.
    values = [_sharded((16384, 8), RowSlabs((16384, 8), 4681)),
              LazyTensor("wo", (6144, 2048), np.float16, RowSlabs((6144, 2048), 1365), chunk_shape=(6144, 32)),
              LazyTensor("n", (8,), np.float32, lambda: np.zeros(8, np.float32))]
    for target in (1 << 16, 1 << 24):
      _, located, sizes = plan_blocks(values, target)
      planned = [(leaf, index, nbytes) for (leaf, index), nbytes in zip(located, sizes)]
      in_order = [(next(i for i, v in enumerate(values) if v is lazy), index, nbytes)
                  for lazy, index, nbytes in blocks_in_order(values, target)]
      self.assertEqual(in_order, planned)
      self.assertGreater(len(planned), len(values))

  def test_the_largest_leaves_are_written_last_ties_in_tree_order(self):
    values = [LazyTensor(name, shape, np.float32, lambda: None)
              for name, shape in (("big", (64, 64)), ("small", (4,)), ("mid_a", (8, 8)), ("mid_b", (64,)))]
    self.assertEqual(write_order([v.nbytes for v in values]), [1, 2, 3, 0])
    _, located, _ = plan_blocks(values, 1 << 10)
    self.assertEqual([values[leaf].name for leaf, _ in located], ["small", "mid_a", "mid_b", "big"])


if __name__ == "__main__":
  absltest.main()
