"""Codes times block scales, a region at a time: every region, transposed or not, with partial blocks and pieces
smaller than a row, equals the whole weight dequantized in numpy; packed codes decode through their table."""

from unittest import mock

import numpy as np
from absl.testing import absltest, parameterized

from converter.sources import scaled


def _weight(shape, block, seed=0):
  """Codes, scales and the dequantized float32 weight, `shape` (..., rows, cols) in blocks `block` (the last
  block on each axis partial where the shape says so)."""
  rng = np.random.default_rng(seed)
  codes = rng.integers(-8, 8, shape).astype(np.float32)
  grid = shape[:-2] + (-(-shape[-2] // block[0]), -(-shape[-1] // block[1]))
  scales = rng.uniform(0.5, 2, grid).astype(np.float32)
  full = np.repeat(np.repeat(scales, block[0], axis=-2), block[1], axis=-1)[..., :shape[-2], :shape[-1]]
  return codes, scales, codes * full


class ReadScaledTest(parameterized.TestCase):

  @parameterized.parameters(
      ((37, 50), (8, 16), (slice(3, 30),), False),
      ((37, 50), (8, 16), (slice(3, 30), slice(5, 49)), True),
      ((3, 20, 24), (1, 32), (1, slice(7, 20)), False),  # One scale per row group of 32 inputs; partial.
      ((2, 33, 65), (16, 16), (slice(0, 2), slice(1, 33), slice(15, 65)), True),
  )
  def test_a_region_equals_the_numpy_dequantization(self, shape, block, region, transpose):
    codes, scales, expected = _weight(shape, block)
    calls = []

    def read_codes(lead, rows, cols):
      calls.append((rows, cols))
      return codes[lead + (rows, cols)].copy()  # Fresh, as a code reader returns them: dequantized in place.

    def read_scales(lead, rows, cols):
      return scales[lead + (rows, cols)]

    for piece_values in (scaled.PIECE_VALUES, 7):  # Pieces of several rows, and pieces of part of a row.
      calls.clear()
      with mock.patch.object(scaled, "PIECE_VALUES", piece_values):
        got = scaled.read_scaled(shape, region, np.float32, transpose, block, read_codes, read_scales)
      want = expected[region]
      np.testing.assert_array_equal(got, np.swapaxes(want, -1, -2) if transpose else want)
      if piece_values == 7:
        self.assertGreater(len(calls), want.shape[-2])  # Each row read in several pieces.

  def test_rounded_once_to_the_output_dtype(self):
    codes, scales, expected = _weight((16, 16), (4, 4))
    got = scaled.read_scaled((16, 16), (), np.float16, False, (4, 4),
                             lambda lead, r, c: codes[r, c].copy(), lambda lead, r, c: scales[r, c])
    np.testing.assert_array_equal(got, expected.astype(np.float16))


class DecodeBytesTest(absltest.TestCase):

  def test_each_byte_yields_its_table_row_lowest_bits_first(self):
    table = np.array([[b & 0xF, b >> 4] for b in range(256)], np.float32)  # Two 4-bit codes a byte.
    data = np.array([[0x21, 0x43], [0xF0, 0x0F]], np.uint8)
    np.testing.assert_array_equal(scaled.decode_bytes(data, table, 0, 4), [[1, 2, 3, 4], [0, 15, 15, 0]])
    np.testing.assert_array_equal(scaled.decode_bytes(data, table, 1, 2), [[2, 3], [15, 15]])


if __name__ == "__main__":
  absltest.main()
