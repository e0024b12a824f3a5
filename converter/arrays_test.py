"""The tiled transpose equals numpy's, bit for bit, for 2-D and stacked (3-D) arrays, and is contiguous."""

import ml_dtypes
import numpy as np
from absl.testing import absltest

from converter import arrays


class ArraysTest(absltest.TestCase):

  def test_transpose_last_two_equals_numpy(self):
    for shape in ((1, 1), (5, 3), (16, 7), (33, 70), (100, 17), (3, 33, 20)):
      x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
      y = arrays.transpose_last_two(x)
      np.testing.assert_array_equal(y, np.swapaxes(x, -1, -2))
      self.assertTrue(y.flags.c_contiguous)

  def test_transpose_moves_bits_of_every_dtype(self):
    rng = np.random.default_rng(0)
    for dtype in (ml_dtypes.bfloat16, np.float16, ml_dtypes.float8_e4m3fn, np.float32, np.float64):
      x = rng.integers(0, 256, size=(2, 37, 19 * np.dtype(dtype).itemsize), dtype=np.uint8).view(dtype)
      y = arrays.transpose_last_two(x)
      self.assertEqual(y.dtype, x.dtype)
      np.testing.assert_array_equal(arrays.as_bits(y), np.swapaxes(arrays.as_bits(x), -1, -2))  # NaNs included.

  def test_transpose_across_tiles_power_of_two_widths_and_stacked_matrices(self):
    rng = np.random.default_rng(1)
    cases = ((ml_dtypes.bfloat16, (130, 2048)),  # Two bands of 1024 columns; a power-of-two width.
             (ml_dtypes.bfloat16, (300, 2500)),  # Two tiles of rows (256 and 44) by three bands, the last partial.
             (np.float32, (2, 200, 1024)),  # Stacked matrices large enough to go one by one.
             (np.float32, (3, 17, 4096)),  # Stacked and small: each tile spans every matrix.
             (np.uint8, (40, 70000)),  # Bands of 2048 columns and a partial one.
             (ml_dtypes.float8_e4m3fn, (64, 64)))
    for dtype, shape in cases:
      x = rng.integers(0, 256, size=shape[:-1] + (shape[-1] * np.dtype(dtype).itemsize,), dtype=np.uint8).view(dtype)
      y = arrays.transpose_last_two(x)
      self.assertEqual((y.dtype, y.shape), (x.dtype, shape[:-2] + (shape[-1], shape[-2])))
      self.assertTrue(y.flags.c_contiguous)
      np.testing.assert_array_equal(arrays.as_bits(y), np.swapaxes(arrays.as_bits(x), -1, -2))

  def test_assign_moves_bits_or_casts(self):
    nan_payload = np.array([0x7FC1, 0xFFFF, 0x0001], np.uint16).view(ml_dtypes.bfloat16)
    target = np.zeros((2, 3), ml_dtypes.bfloat16)
    arrays.assign(target[1], nan_payload)
    np.testing.assert_array_equal(arrays.as_bits(target[1]), arrays.as_bits(nan_payload))
    arrays.assign(target[0], np.array([1.5, -2.0, 3.0], np.float32))  # A cast, not the float32 bits.
    np.testing.assert_array_equal(target[0].astype(np.float32), [1.5, -2.0, 3.0])

  def test_placed_shape_swaps_the_last_two_axes_only_when_transposing(self):
    self.assertEqual(arrays.placed_shape((2, 3, 5), True), (2, 5, 3))
    self.assertEqual(arrays.placed_shape([3, 5], True), (5, 3))
    self.assertEqual(arrays.placed_shape((2, 3, 5), False), (2, 3, 5))

  def test_private_copy_moves_bits_casts_and_transposes(self):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4).astype(ml_dtypes.bfloat16)
    view = x[:, 1:]  # Not contiguous, like a region of a file map.
    for dtype in (ml_dtypes.bfloat16, np.float32):
      for transpose in (False, True):
        copy = arrays.private_copy(view, np.dtype(dtype), transpose)
        expected = view.astype(dtype)
        np.testing.assert_array_equal(copy, np.swapaxes(expected, -1, -2) if transpose else expected)
        self.assertEqual(copy.dtype, np.dtype(dtype))
        self.assertTrue(copy.flags.c_contiguous and copy.flags.writeable)
        self.assertFalse(np.shares_memory(copy, x))

  def test_copy_into_places_pieces_of_a_larger_array(self):
    rng = np.random.default_rng(2)
    x = rng.integers(0, 1 << 16, size=(600, 300), dtype=np.uint16).view(ml_dtypes.bfloat16)
    transposed = np.zeros((300, 600), ml_dtypes.bfloat16)
    as_float = np.zeros((600, 300), np.float32)
    for rows in (slice(0, 256), slice(256, 512), slice(512, 600)):  # As mapped_file copies a region.
      arrays.copy_into(transposed[:, rows], x[rows], transpose=True)
      arrays.copy_into(as_float[rows], x[rows])
    np.testing.assert_array_equal(arrays.as_bits(transposed), arrays.as_bits(x).T)  # NaN payloads included.
    np.testing.assert_array_equal(as_float, x.astype(np.float32))


if __name__ == "__main__":
  absltest.main()
