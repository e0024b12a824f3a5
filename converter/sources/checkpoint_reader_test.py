"""CheckpointReader on checkpoints written by our own streaming handlers: leaves listed from the metadata, slices
read back equal to what was written, the stored chunk grid, native fp8 leaves dequantized as MaxText does, and
errors that name the checkpoint and the leaf."""

import glob
import os
import tempfile
from unittest import mock

import jax

jax.config.update("jax_platforms", "cpu")

import ml_dtypes  # pylint: disable=g-import-not-at-top,g-bad-import-order
import numpy as np
import orbax.checkpoint as ocp
from absl.testing import absltest, parameterized

from converter.sources import checkpoint_reader  # pylint: disable=g-import-not-at-top
from converter.sources.checkpoint_reader import CheckpointReader, StoredArray, cache_bytes
from converter.errors import ConversionError
from handlers import ITEMS, LazyTensor, WriteOptions, lazy_tensor_context

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # Every zstd frame starts with it; each compressed chunk is one frame.


class _Blocks:
  """A loader with natural blocks of `block_shape`: a small write budget keeps them as the stored chunks."""

  def __init__(self, value: np.ndarray, block_shape: tuple[int, ...]):
    self.value = value
    self.block_shape = block_shape

  def __call__(self) -> np.ndarray:
    return self.value

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    return self.value[index]


def _save(params: dict[str, tuple[np.ndarray, tuple[int, ...]]], max_inflight_bytes: int,
          compression: bool = True) -> str:
  """A TrainState-shaped checkpoint of `params` (name: (value, block)) saved through our handlers; its items path."""
  out = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
  tree = {"step": 0, "opt_state": {},
          "params": {"params": {name: LazyTensor(name, value.shape, value.dtype, _Blocks(value, block))
                                for name, (value, block) in params.items()}}}
  options = WriteOptions(max_inflight_bytes=max_inflight_bytes, compression=compression)
  checkpointer = ocp.v1.training.Checkpointer(out, context=lazy_tensor_context(options))
  checkpointer.save_checkpointables(0, {ITEMS: tree})
  checkpointer.close()
  return os.path.join(out, "0", ITEMS)


def _values(seed: int, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


class CheckpointReaderTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.stacked = _values(0, (4, 6, 8))  # Stored in chunks of (1, 3, 8): 8 chunks.
    cls.table = _values(1, (10, 4), ml_dtypes.bfloat16)  # One chunk.
    # A budget of 4 chunks of `stacked` keeps its write blocks (and so its stored chunks) at the loader's blocks.
    cls.items = _save({"stacked": (cls.stacked, (1, 3, 8)), "table": (cls.table, (10, 4))}, 4 * 3 * 8 * 4)
    cls.reader = CheckpointReader(cls.items)

  def array(self, name: str) -> StoredArray:
    return self.reader.arrays[("params", "params", name)]

  def test_arrays_come_from_the_metadata(self):
    self.assertEqual(sorted(self.reader.arrays), [("params", "params", "stacked"), ("params", "params", "table")])
    self.assertEqual(self.array("stacked"), StoredArray(("params", "params", "stacked"), "params.params.stacked",
                                                        (4, 6, 8), np.dtype(np.float32)))
    self.assertEqual((self.array("table").dtype, self.array("table").nbytes), (np.dtype(ml_dtypes.bfloat16), 80))
    self.assertNotIn(("step",), self.reader.arrays)  # The scalar step is not an array leaf.

  @parameterized.parameters(
      ((2,),), ((0, slice(1, 5)),), ((slice(1, 3), 4),), ((3, slice(None), slice(2, 6)),), ((),),
  )
  def test_slices_read_back_what_was_written(self, index):
    opened = self.reader.open(self.array("stacked"), index, cache_limit=1 << 20)
    got = opened.read(index)
    self.assertTrue(got.flags.c_contiguous)
    np.testing.assert_array_equal(got, self.stacked[index])

  def test_every_layer_of_a_stacked_leaf_through_one_open_array(self):
    # One open array serves consecutive slices (the reverse direction's pattern), each from its own chunks.
    opened = self.reader.open(self.array("stacked"), (0,), cache_limit=1 << 20)
    for layer in range(4):
      np.testing.assert_array_equal(opened.read((layer,)), self.stacked[layer])
    table = self.reader.open(self.array("table"), (), cache_limit=1 << 20).read(())
    self.assertEqual(table.tobytes(), self.table.tobytes())

  def test_chunk_shape_is_the_stored_grid(self):
    self.assertEqual(self.reader.chunk_shape(self.array("stacked")), (1, 3, 8))
    self.assertEqual(self.reader.chunk_shape(self.array("table")), (10, 4))

  @parameterized.parameters(
      ((2, slice(4, 6)), (2, 1, 0)),
      ((slice(1, 3),), (1, 0, 0)),
      ((3, 2, slice(5, 8)), (3, 0, 0)),
      ((), (0, 0, 0)),
  )
  def test_first_chunk(self, index, chunk):
    self.assertEqual(self.reader.first_chunk(self.array("stacked"), index), chunk)

  def test_cache_holds_one_chunk_at_least_and_every_chunk_of_a_slice_up_to_the_limit(self):
    array = StoredArray(("w",), "w", (4, 6, 8), np.dtype(np.float32))
    chunk, chunk_bytes, headroom = (1, 3, 8), 96, 1 << 20
    with_headroom = lambda n: n + n // 8 + headroom
    # A layer touches the 2 chunks of that layer; a full-range slice on axis 1 of one layer the same 2.
    self.assertEqual(cache_bytes(array, chunk, (0,), limit=1 << 30), with_headroom(2 * chunk_bytes))
    # Every layer at once: all 8 chunks.
    self.assertEqual(cache_bytes(array, chunk, (slice(None),), limit=1 << 30), with_headroom(8 * chunk_bytes))
    # A limit below the working set caps it, but never below one chunk.
    self.assertEqual(cache_bytes(array, chunk, (slice(None),), limit=300), with_headroom(300))
    self.assertEqual(cache_bytes(array, chunk, (slice(None),), limit=10), with_headroom(chunk_bytes))

  def test_a_directory_without_metadata_is_refused(self):
    empty = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    with self.assertRaisesRegex(ConversionError, "not an Orbax PyTree checkpoint"):
      CheckpointReader(empty)


class _CountedStore:
  """A stored array whose slicings are counted: each is one read TensorStore is asked for."""

  def __init__(self, store):
    self.store = store
    self.reads = 0

  def __getitem__(self, index):
    self.reads += 1
    return self.store[index]


class ReadInPiecesTest(parameterized.TestCase):
  """A read larger than READ_PIECE_BYTES comes in pieces cut on the stored chunks, equal to one whole read, in C
  order and in a kept element order."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.value = _values(2, (3, 12, 10))
    out = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    tree = {"step": 0, "opt_state": {}, "params": {"params": {
        "c_order": LazyTensor("c_order", cls.value.shape, cls.value.dtype, _Blocks(cls.value, (1, 12, 10)),
                              chunk_shape=(1, 3, 5)),
        "kept_order": LazyTensor("kept_order", cls.value.shape, cls.value.dtype, _Blocks(cls.value, (1, 12, 10)),
                                 chunk_shape=(1, 3, 5), element_order=(0, 2, 1)),
    }}}
    checkpointer = ocp.v1.training.Checkpointer(out, context=lazy_tensor_context(WriteOptions(1 << 20)))
    checkpointer.save_checkpointables(0, {ITEMS: tree})
    checkpointer.close()
    cls.reader = CheckpointReader(os.path.join(out, "0", ITEMS))

  @parameterized.product(
      name=["c_order", "kept_order"],
      index=[(1,), (slice(None),), (2, slice(1, 11)), (slice(0, 2), slice(4, 12), slice(3, 9)), (0, 7)],
  )
  def test_pieces_equal_the_whole_read(self, name, index):
    array = self.reader.arrays[("params", "params", name)]
    opened = self.reader.open(array, index, cache_limit=0)
    counted = opened._store = _CountedStore(opened._store)  # pylint: disable=protected-access
    piece = 2 * 3 * 5 * 4  # Two chunks' rows: a read of more comes in several.
    with mock.patch.object(checkpoint_reader, "READ_PIECE_BYTES", piece):
      got = opened.read(index)
    np.testing.assert_array_equal(got, self.value[index])
    if name == "c_order":
      self.assertTrue(got.flags.c_contiguous)
    if self.value[index].nbytes > 3 * piece:
      self.assertGreater(counted.reads, 1)
    else:
      self.assertGreaterEqual(counted.reads, 1)


class DamagedChunkTest(absltest.TestCase):

  def test_a_damaged_chunk_names_the_leaf_and_the_slice(self):
    value = _values(2, (4, 64, 64))  # 16 KiB chunks: stored as zstd frames in a data file, not inlined.
    items = _save({"experts": (value, (1, 64, 64))}, 4 * 64 * 64 * 4)
    frames = {}
    for path in glob.glob(os.path.join(items, "**", "d", "*"), recursive=True):
      with open(path, "rb") as f:
        data = f.read()
      frames[path] = [i for i in range(len(data) - 3) if data[i:i + 4] == _ZSTD_MAGIC]
    # The 4 chunks (about 15 KiB of zstd each), in one data file or several: OCDBT may flush concurrent writes to
    # different files. The small files hold its b-tree nodes, which stay intact.
    frames = {path: offsets for path, offsets in frames.items() if os.path.getsize(path) > 8 << 10}
    self.assertGreaterEqual(sum(len(f) for f in frames.values()), 4)
    for path, offsets in frames.items():
      with open(path, "r+b") as f:  # Garbles the frame header of every chunk.
        for offset in offsets:
          f.seek(offset + 4)
          f.write(b"\xff" * 8)
    reader = CheckpointReader(items)
    opened = reader.open(reader.arrays[("params", "params", "experts")], (0,), cache_limit=1 << 20)
    with self.assertRaisesRegex(ConversionError, rf"{items}: reading leaf params/params/experts at \[1\] failed"):
      opened.read((1,))


class Fp8Test(absltest.TestCase):

  def test_fp8_leaves_are_dequantized_as_maxtext_does_and_their_scales_hidden(self):
    kernel = _values(3, (8, 12), ml_dtypes.float8_e4m3fn)
    scale = np.abs(_values(4, (2, 3))) + 0.5  # One scale per 4 x 4 block.
    items = _save({"kernel": (kernel, (8, 12)), "kernel_scale": (scale, (2, 3))}, 1 << 20)
    reader = CheckpointReader(items, dequantize_fp8=True)
    self.assertEqual(list(reader.arrays), [("params", "params", "kernel")])
    array = reader.arrays[("params", "params", "kernel")]
    self.assertEqual((array.shape, array.dtype), ((8, 12), np.dtype(np.float32)))
    self.assertEqual(reader.chunk_shape(array), (8, 12))  # The FP8 values' chunks.
    expected = kernel.astype(np.float32) * np.kron(scale, np.ones((4, 4), np.float32))
    opened = reader.open(array, (slice(None),), cache_limit=1 << 20)
    # Slices that start and stop inside scale blocks, and a single row.
    for index in [(slice(None),), (slice(3, 7), slice(2, 11)), (5,), (slice(0, 1), slice(7, 9))]:
      np.testing.assert_array_equal(opened.read(index), expected[index], err_msg=str(index))
    # Without dequantize_fp8, the leaf and its scales are two stored arrays.
    plain = CheckpointReader(items)
    self.assertEqual(plain.arrays[("params", "params", "kernel")].dtype, np.dtype(ml_dtypes.float8_e4m3fn))
    self.assertIn(("params", "params", "kernel_scale"), plain.arrays)

  def test_scales_that_do_not_divide_the_leaf_are_refused(self):
    items = _save({"kernel": (_values(5, (8, 12), ml_dtypes.float8_e4m3fn), (8, 12)),
                   "kernel_scale": (np.ones((3, 3), np.float32), (3, 3))}, 1 << 20)
    with self.assertRaisesRegex(ConversionError, r"params/params/kernel \(8, 12\) has scales \(3, 3\)"):
      CheckpointReader(items, dequantize_fp8=True)


if __name__ == "__main__":
  absltest.main()
