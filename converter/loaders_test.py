"""Loaders' slab arithmetic: which output axis a run of source rows makes, for every kind of family op chain."""

from absl.testing import absltest

from converter import loaders, ops


class RowSlabsTest(absltest.TestCase):

  def test_row_slabs(self):
    self.assertEqual(loaders.row_slabs((ops.PadRows(8), ops.ScaleInFloat32(2.0)), (4, 3)), loaders.Slabs(0, 1))
    self.assertEqual(loaders.row_slabs((ops.Transpose(), ops.PadColumns(8)), (4, 3)), loaders.Slabs(1, 1))
    self.assertEqual(loaders.row_slabs(ops.to_heads_kernel(3, 2, 5) + (ops.InterleaveRope(),), (10, 3)),
                     loaders.Slabs(1, 5))  # (H*D, E) -> (E, H, D): whole heads.
    self.assertEqual(loaders.row_slabs(ops.to_out_kernel(3, 2, 5), (3, 10)), loaders.Slabs(2, 1))
    self.assertIsNone(loaders.row_slabs((ops.Transpose(), ops.Reshape((4,))), (2, 2)))
    self.assertIsNone(loaders.row_slabs((), (2, 3, 4)))


if __name__ == "__main__":
  absltest.main()
