"""A region read with one ranged request: the bytes between its first and last element are fetched, whatever the
region (rows, a 2-D block, a transposed copy), and the values equal numpy's of the whole tensor."""

import os
import tempfile
from unittest import mock

import numpy as np
from absl.testing import absltest

from converter import storage
from converter.storage import ranged_file


class RangedFileTest(absltest.TestCase):

  def test_a_region_is_read_in_one_request_for_its_span(self):
    tensor = np.random.default_rng(0).standard_normal((6, 5, 4)).astype(np.float32)
    begin = 16  # Bytes before the tensor in the file (a header).
    path = os.path.join(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")), "t.bin")
    with open(path, "wb") as f:
      f.write(bytes(begin) + tensor.tobytes())
    row = tensor[0].nbytes
    for slices, transpose, expected in (((slice(2, 4),), False, tensor[2:4]),
                                        ((slice(1, 3), slice(2, 5)), False, tensor[1:3, 2:5]),
                                        ((slice(3, 4),), True, np.swapaxes(tensor[3:4], -1, -2))):
      first = begin + slices[0].start * row + (slices[1].start * tensor[0, 0].nbytes if len(slices) > 1 else 0)
      last = begin + (slices[0].stop - 1) * row + (slices[1].stop * tensor[0, 0].nbytes if len(slices) > 1 else row)
      with mock.patch.object(storage, "read_bytes", wraps=storage.read_bytes) as read_bytes:
        got = ranged_file.read(path, begin, np.dtype(np.float32), tensor.shape, slices, (first, last),
                               np.dtype(np.float64), transpose)
      read_bytes.assert_called_once_with(path, first, last)
      np.testing.assert_array_equal(got, expected.astype(np.float64))
      self.assertTrue(got.flags.c_contiguous and got.flags.writeable)

  def test_an_empty_span_reads_nothing(self):
    with mock.patch.object(storage, "read_bytes") as read_bytes:
      got = ranged_file.read("gs://b/o", 0, np.dtype(np.float32), (4, 3), (slice(2, 2),), (8, 8), np.dtype(np.float32))
    read_bytes.assert_not_called()
    self.assertEqual(got.shape, (0, 3))


if __name__ == "__main__":
  absltest.main()
