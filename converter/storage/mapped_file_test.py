"""mapped_file: regions copied (and transposed) a piece at a time, the file pages of each piece unmapped after it."""

import os
from unittest import mock

import numpy as np
from absl.testing import absltest, parameterized

from converter.storage import mapped_file

_HEADER = 136  # Tensors start at unaligned offsets in safetensors files.


def _mapped_kib(path: str) -> int:
  """Resident KiB of this process's mappings of `path` (/proc/self/smaps)."""
  total, inside = 0, False
  with open("/proc/self/smaps") as f:
    for line in f:
      fields = line.split()
      if "-" in fields[0] and len(fields) >= 5:  # A mapping's header line.
        inside = fields[-1] == path
      elif inside and fields[0] == "Rss:":
        total += int(fields[1])
  return total


class MappedFileTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.path = os.path.join(self.create_tempdir().full_path, "tensor.bin")
    self.value = np.random.default_rng(0).integers(0, 1 << 16, (3072, 4096), dtype=np.uint16)  # 24 MiB.
    with open(self.path, "wb") as f:
      f.write(bytes(_HEADER))
      f.write(self.value.tobytes())

  def read(self, slices, transpose, dtype=np.uint16):
    return mapped_file.read(self.path, _HEADER, np.dtype(np.uint16), self.value.shape, slices, (0, 0),
                            np.dtype(dtype), transpose=transpose)

  @parameterized.parameters(False, True)
  def test_regions_equal_the_file_and_only_a_piece_stays_mapped(self, transpose):
    copy_into, most = mapped_file.copy_into, []

    def measured(target, part, transposed):
      copy_into(target, part, transposed)
      most.append(_mapped_kib(self.path))

    for slices in ((slice(0, 3072),), (slice(5, 3001), slice(100, 4000))):
      with mock.patch.object(mapped_file, "copy_into", measured):
        got = self.read(slices, transpose)
      expected = self.value[slices]
      np.testing.assert_array_equal(got, expected.T if transpose else expected)
      self.assertTrue(got.flags.c_contiguous)
    self.assertGreater(len(most), 4)
    # One piece (256 rows of 8 KiB when transposed) and the fault-around beside it, never the 24 MiB region.
    self.assertLessEqual(max(most), 2 * 4096 + 2 * 2048 + 4)

  def test_casts_and_odd_shapes(self):
    np.testing.assert_array_equal(self.read((slice(7, 8),), True, np.int32), self.value[7:8].T.astype(np.int32))
    np.testing.assert_array_equal(self.read((slice(9, 9),), True), np.zeros((4096, 0), np.uint16))
    np.testing.assert_array_equal(self.read((slice(1, 300),), False, np.float32),
                                  self.value[1:300].astype(np.float32))


if __name__ == "__main__":
  absltest.main()
