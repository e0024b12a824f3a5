"""Every op recipe the families use comes back through `ops.inverse_ops`: bit for bit where `ops.is_exact` says
so, within one unit in the last place otherwise (float32 and bfloat16).

The reverse conversion (MaxText -> HF) is built from these inverses, so an inverse that drifts would corrupt every
round trip; this checks them on their own, without a checkpoint or JAX.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from absl.testing import absltest

from converter import ops
from tools.testing.ulps import spacing, ulps


class OpsTest(absltest.TestCase):

  def test_every_op_inverts(self):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((96, 40)).astype(np.float32)
    recipes = [
        ops.to_heads_kernel(40, 2, 48) + (ops.InterleaveRope(), ops.ScaleInFloat32(1 / np.sqrt(48))),
        ops.to_out_kernel(96, 2, 20), (ops.PadRows(100),), (ops.Transpose(), ops.PadColumns(99)),
        (ops.ScaleInFloat32(0.125),), (ops.AddInFloat32(1.0),),
        (ops.Reshape((2, 48, 2, 20)), ops.Permute((2, 3, 1, 0))),  # A conv kernel (O, I, kh, kw) -> HWIO.
    ]
    for dtype in (np.float32, ml_dtypes.bfloat16):
      for recipe in recipes:
        value = x.astype(dtype)
        for op in recipe:
          value = op(value)
        self.assertEqual(value.shape, ops.output_shape(recipe, x.shape))
        for op in ops.inverse_ops(recipe, x.shape):
          value = op(value)
        original = x.astype(dtype)
        self.assertEqual((value.shape, value.dtype), (original.shape, original.dtype), recipe)
        if ops.is_exact(recipe):
          self.assertEqual(value.tobytes(), original.tobytes(), recipe)
        elif any(isinstance(op, ops.AddInFloat32) for op in recipe):
          # x + 1 - 1 keeps the precision of 1 + |x|, not of x: within one ulp of 1 + |x|.
          wide = original.astype(np.float32)
          self.assertTrue(np.all(np.abs(value.astype(np.float32) - wide) <= spacing(1 + np.abs(wide), dtype)), recipe)
        else:
          self.assertLessEqual(float(ulps(value, original).max()), 1.0, recipe)

  def test_float32_arithmetic_slab_by_slab_equals_the_whole_array_formula(self):
    # 3000 x 200 float32 values are 2.3 MiB: three slabs, the last one partial.
    x = np.random.default_rng(1).standard_normal((3000, 2, 100)).astype(np.float32)
    for dtype in (np.float32, ml_dtypes.bfloat16):
      value = x.astype(dtype)
      for op, formula in ((ops.ScaleInFloat32(1 / np.sqrt(40)), lambda y: y * np.float32(1 / np.sqrt(40))),
                          (ops.DivideInFloat32(0.3), lambda y: y / np.float32(0.3)),
                          (ops.AddInFloat32(1.0), lambda y: y + np.float32(1.0))):
        expected = formula(value.astype(np.float32)).astype(dtype)
        before = value.tobytes()
        self.assertEqual(op(value).tobytes(), expected.tobytes(), (op, dtype))
        self.assertEqual(value.tobytes(), before, (op, dtype))  # The input is not changed (a reader may cache it).

  def test_integer_ids_are_held_exactly_or_refused(self):
    ids = ops.IntegerIds(256)
    self.assertTrue(ids.exact_in(np.dtype(ml_dtypes.bfloat16)))  # 0..255: 8 significant bits.
    self.assertFalse(ops.IntegerIds(257).exact_in(np.dtype(ml_dtypes.bfloat16)))
    self.assertTrue(ops.IntegerIds(2 ** 24).exact_in(np.dtype(np.float32)))
    table = np.array([[3, 255], [0, 7]], np.float32)
    back = ids.inverse(table.shape)(ids(table))
    self.assertEqual((back.dtype, back.tolist()), (np.dtype(np.int64), [[3, 255], [0, 7]]))
    for bad in (np.array([256.0], np.float32), np.array([-1.0], np.float32), np.array([2.5], np.float32)):
      with self.assertRaisesRegex(ValueError, "ids outside the integers 0..255"):
        ids(bad)

  def test_permute_reorders_axes_and_its_inverse_restores_them(self):
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    op = ops.Permute((2, 3, 1, 0))
    self.assertEqual(op.shape(x.shape), (4, 5, 3, 2))
    self.assertEqual(op(x)[1, 2, 0, 1], x[1, 0, 1, 2])
    self.assertEqual(op.inverse(x.shape), ops.Permute((3, 2, 0, 1)))
    with self.assertRaisesRegex(ValueError, "cannot permute"):
      op.shape((2, 3, 4))


if __name__ == "__main__":
  absltest.main()
