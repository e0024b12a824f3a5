"""Region arithmetic every source reads through: a region's bounds, shape and slices must agree with numpy's own
indexing of the same region, and regions numpy would take but a source cannot read (steps) are refused."""

import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized

from converter.sources import base

_SHAPE = (5, 4, 3)
_ARRAY = np.arange(np.prod(_SHAPE)).reshape(_SHAPE)

# Regions as the plan asks for them: an expert, a layer, a run of rows, negative ints, slices past the end.
_REGIONS = (
    (),
    (2,),
    (-1,),
    (slice(1, 3),),
    (slice(None), 0),
    (4, slice(1, 4)),
    (slice(3, 100),),
    (slice(-2, None), -4),
    (slice(3, 1),),  # Empty.
    (1, 2, 0),
)


class RegionTest(parameterized.TestCase):

  @parameterized.parameters(*_REGIONS)
  def test_region_shape_is_numpys(self, *region):
    self.assertEqual(base.region_shape(_SHAPE, region), _ARRAY[region].shape)

  @parameterized.parameters(*_REGIONS)
  def test_reading_as_slices_then_squeezing_equals_indexing(self, *region):
    # What a source does: read every axis as a slice (keeping int axes as length 1), then drop the int axes.
    as_read = _ARRAY[base.as_slices(_SHAPE, region)]
    np.testing.assert_array_equal(base.squeeze_ints(as_read, region), _ARRAY[region])

  def test_bounds_normalise_negative_ints_and_clip_slices(self):
    self.assertEqual(base.region_bounds(_SHAPE, (-1, slice(2, 100))), ((4, 5), (2, 4)))
    self.assertEqual(base.region_bounds(_SHAPE, (slice(-2, None),)), ((3, 5),))
    self.assertEqual(base.region_bounds(_SHAPE, (slice(3, 1),)), ((3, 3),))  # Empty, never reversed.
    self.assertEqual(base.region_bounds(_SHAPE, ()), ())

  @parameterized.named_parameters(
      ("step", (slice(0, 4, 2),), "only step-1 slices"),
      ("reversed", (slice(None, None, -1),), "only step-1 slices"),
      ("index_past_the_end", (5,), "index 5 out of range for axis of size 5"),
      ("index_before_the_start", (0, -5), "index -5 out of range for axis of size 4"),
      ("too_many_axes", (0, 0, 0, 0), "more axes than shape"),
  )
  def test_unreadable_regions_are_refused(self, region, message):
    with self.assertRaisesRegex(ValueError, message):
      base.region_bounds(_SHAPE, region)

  def test_squeeze_ints_keeps_a_region_of_slices_as_is(self):
    value = _ARRAY[1:3]
    self.assertIs(base.squeeze_ints(value, (slice(1, 3),)), value)


class NbytesAndDtypesTest(parameterized.TestCase):

  @parameterized.parameters(((3, 4), np.float32, 48), ((3, 4), ml_dtypes.bfloat16, 24), ((), np.float64, 8),
                            ((7, 0), np.float32, 0))
  def test_nbytes(self, shape, dtype, expected):
    self.assertEqual(base.nbytes(shape, dtype), expected)

  def test_floating_dtypes_are_the_ones_a_plan_can_cast(self):
    self.assertEqual(base.FLOATING, {np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16),
                                     np.dtype(ml_dtypes.bfloat16)})
    self.assertNotIn(np.dtype(ml_dtypes.float8_e4m3fn), base.FLOATING)  # Stored FP8 is read via its scales.
    self.assertNotIn(np.dtype(np.int32), base.FLOATING)


if __name__ == "__main__":
  absltest.main()
