"""Loaders' slab arithmetic: which output axis a run of source rows makes, for every kind of family op chain."""

import dataclasses

import ml_dtypes
import numpy as np
from absl.testing import absltest

from converter import loaders, ops


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
