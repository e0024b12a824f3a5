"""Loaders' slab arithmetic: which output axis a run of source rows makes, for every kind of family op chain."""

import dataclasses

import ml_dtypes
import numpy as np
from absl.testing import absltest

from converter import ops
from converter.planning import loaders


@dataclasses.dataclass(frozen=True)
class _Array:
  """A loader of a fixed array (what a FromTensor gives), its regions fresh copies."""

  value: np.ndarray

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    return self.value[index].copy()


class RowSlabsTest(absltest.TestCase):

  def test_row_slabs(self):
    self.assertEqual(loaders.row_slabs((ops.PadRows(8), ops.ScaleInFloat32(2.0)), (4, 3)), loaders.Slabs(0, 1))
    self.assertEqual(loaders.row_slabs((ops.Transpose(), ops.PadColumns(8)), (4, 3)), loaders.Slabs(1, 1))
    self.assertEqual(loaders.row_slabs(ops.to_heads_kernel(3, 2, 5) + (ops.InterleaveRope(),), (10, 3)),
                     loaders.Slabs(1, 5))  # (H*D, E) -> (E, H, D): whole heads.
    self.assertEqual(loaders.row_slabs(ops.to_out_kernel(3, 2, 5), (3, 10)), loaders.Slabs(2, 1))
    self.assertIsNone(loaders.row_slabs((ops.Transpose(), ops.Reshape((4,))), (2, 2)))
    self.assertIsNone(loaders.row_slabs((), (2, 3, 4)))


@dataclasses.dataclass(frozen=True)
class _Tensor:
  """A source tensor: private copies of regions, transposed while copied when asked (as safetensors' are)."""

  value: np.ndarray

  @property
  def shape(self):
    return self.value.shape

  def read(self, dtype, region=(), transpose=False):
    x = np.array(self.value[tuple(region)], dtype=dtype)
    return np.ascontiguousarray(x.T) if transpose else x


def _layout(x: np.ndarray) -> tuple[int, ...]:
  return tuple(sorted(range(x.ndim), key=lambda axis: -x.strides[axis]))


class SourceOrderTest(absltest.TestCase):

  def test_the_source_layout_of_a_transpose_and_reshapes(self):
    self.assertEqual(loaders.source_order((ops.Transpose(),), (6, 4)), (1, 0))
    self.assertEqual(loaders.source_order(ops.to_heads_kernel(3, 2, 5), (10, 3)), (1, 2, 0))  # (E, H, D)
    self.assertEqual(loaders.source_order(ops.to_out_kernel(3, 2, 5), (3, 10)), (2, 0, 1))  # (H, D, E)
    self.assertEqual(loaders.source_order((ops.Transpose(), ops.PadColumns(6)), (6, 4)), (1, 0))  # Nothing padded.
    self.assertIsNone(loaders.source_order((ops.Transpose(), ops.PadColumns(8)), (6, 4)))
    self.assertIsNone(loaders.source_order(ops.to_heads_kernel(3, 2, 5) + (ops.InterleaveRope(),), (10, 3)))
    self.assertIsNone(loaders.source_order((ops.ScaleInFloat32(2.0),), (6, 4)))
    self.assertIsNone(loaders.source_order((ops.Transpose(),), (2, 6, 4)))

  def test_loaders_in_source_order_read_the_same_values_laid_out_as_the_source(self):
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((10, 3)).astype(np.float32) for _ in range(4)]  # q_proj-like (H*D, E).
    chain = ops.to_heads_kernel(3, 2, 5)
    tensors = [loaders.FromTensor(_Tensor(p), (), chain, np.dtype(np.float32), (3, 2, 5)) for p in parts]
    stack = loaders.Stack(tuple(tensors), 1, (3, 4, 2, 5), np.dtype(np.float32))
    viewed, order = loaders.in_source_order(stack)
    self.assertEqual(order, (1, 2, 3, 0))  # Layers outermost, then each part's (H, D, E).
    for index in ((slice(0, 3), slice(1, 2), slice(0, 2), slice(0, 5)),  # One layer: a view of its read.
                  (slice(0, 3), slice(0, 4), slice(0, 2), slice(0, 5)),  # All of them: a buffer in that layout.
                  (slice(1, 3), slice(1, 3), slice(0, 1), slice(2, 5))):
      expected = stack.region(index)
      got = viewed.region(index)
      np.testing.assert_array_equal(got, expected)
      self.assertTrue(expected.flags.c_contiguous)
      if got.shape[1] > 1 and index[0] == slice(0, 3):
        self.assertEqual(_layout(got), order)
    self.assertIsNone(loaders.in_source_order(loaders.Fill(0.0, (2, 2), np.dtype(np.float32))))
    rope = loaders.FromTensor(_Tensor(parts[0]), (), chain + (ops.InterleaveRope(),), np.dtype(np.float32), (3, 2, 5))
    self.assertIsNone(loaders.in_source_order(loaders.Stack((tensors[0], rope), 0, (2, 3, 2, 5), np.float32)))

  def test_transposes(self):
    tensor = loaders.FromTensor(_Tensor(np.zeros((4, 6))), (), (ops.Transpose(),), np.dtype(np.float32), (6, 4))
    plain = loaders.FromTensor(_Tensor(np.zeros((4, 6))), (), (), np.dtype(np.float32), (4, 6))
    self.assertTrue(loaders.transposes(loaders.Stack((tensor, tensor), 0, (2, 6, 4), np.float32)))
    self.assertFalse(loaders.transposes(loaders.Stack((plain, plain), 0, (2, 4, 6), np.float32)))
    self.assertFalse(loaders.transposes(loaders.Fill(0.0, (2, 2), np.dtype(np.float32))))


class StackTest(absltest.TestCase):

  def test_regions_of_one_part_and_of_several_are_the_stacked_values(self):
    parts = [np.random.default_rng(k).standard_normal((6, 5)).astype(np.float32) for k in range(3)]
    for axis in (0, 1, 2):
      stacked = np.stack(parts, axis=axis)
      stack = loaders.Stack(tuple(_Array(p) for p in parts), axis, stacked.shape, np.dtype(ml_dtypes.bfloat16))
      for along in (slice(1, 2), slice(0, 3), slice(2, 3)):  # One part (returned as it is read), then several.
        index = tuple(along if a == axis else slice(1, 4) for a in range(3))
        region = stack.region(index)
        np.testing.assert_array_equal(region, stacked[index].astype(ml_dtypes.bfloat16))
        self.assertEqual(region.dtype, ml_dtypes.bfloat16)
        self.assertTrue(region.flags.c_contiguous)


if __name__ == "__main__":
  absltest.main()
