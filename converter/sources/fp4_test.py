"""DeepSeek V4's packed FP4: two e2m1 values per I8 byte (low nibble first) times an F8_E8M0 scale per 32 values
of a row, presented as the (out, in) weight; regions and transposed reads equal the whole tensor, which equals an
independent numpy dequantization (tools/quantize.py)."""

import os
import tempfile
from unittest import mock

import ml_dtypes
import numpy as np
from absl.testing import absltest

from converter.errors import ConversionError
from converter.sources import fp4, open_safetensors, safetensors
from tools import quantize
from tools.safetensors_writer import write_safetensors


def _tensors(tensors):
  directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
  write_safetensors(os.path.join(directory, "model.safetensors"), tensors)
  return open_safetensors(directory).tensors


def _fp4(packed, scale):
  stored = _tensors({"w.weight": packed, "w.scale": scale})
  return fp4.fp4_tensor(stored["w.weight"], stored["w.scale"])


class Fp4TensorTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(0)
    # 300 rows: more than one unpacking pass (256 rows), the second partial; 160 values a row: 5 groups of 32.
    weight = (rng.standard_normal((300, 160)) * np.exp2(rng.integers(-9, 3, (300, 1)))).astype(np.float32)
    self.packed, self.scales = quantize.fp4_pack(weight)
    self.expected = quantize.fp4_dequantize(self.packed, self.scales)

  def test_whole_tensor_and_regions_equal_the_numpy_dequantization(self):
    tensor = _fp4(self.packed, self.scales)
    self.assertEqual((tensor.shape, tensor.format), ((300, 160), "FP4 e2m1 (I8 pairs x F8_E8M0 scales per 32)"))
    np.testing.assert_array_equal(tensor.read(np.float32), self.expected)
    regions = [(slice(100, 300),), (slice(255, 258),), (150,), (slice(0, 300), slice(20, 70)), (7, slice(159, 160)),
               (slice(250, 270), 33)]
    for region in regions:
      np.testing.assert_array_equal(tensor.read(np.float32, region), self.expected[region], str(region))

  def test_transposed_reads_swap_the_last_two_axes(self):
    tensor = _fp4(self.packed, self.scales)
    for region in [(), (slice(100, 300),), (slice(250, 270), slice(20, 70))]:
      value = tensor.read(np.float32, region, transpose=True)
      np.testing.assert_array_equal(value, self.expected[region].T, str(region))
      self.assertTrue(value.flags.c_contiguous)

  def test_every_value_is_exact_in_bfloat16(self):
    tensor = _fp4(self.packed, self.scales)
    self.assertEqual(tensor.read().dtype, ml_dtypes.bfloat16)
    np.testing.assert_array_equal(tensor.read().astype(np.float32), self.expected)

  def test_stacked_experts_read_one_expert_at_a_time(self):
    packed, scales = np.stack([self.packed, self.packed[::-1]]), np.stack([self.scales, self.scales[::-1]])
    stored = _tensors({"e.weight": packed, "e.scale": scales})
    tensor = fp4.fp4_tensor(stored["e.weight"], stored["e.scale"])
    self.assertEqual(tensor.shape, (2, 300, 160))
    np.testing.assert_array_equal(tensor.read(np.float32, (1,)), self.expected[::-1])
    np.testing.assert_array_equal(tensor.read(np.float32, (1,), transpose=True), self.expected[::-1].T)

  def test_a_region_reads_only_its_packed_bytes_and_their_scales(self):
    tensor = _fp4(self.packed, self.scales)
    read = []
    stored_read = safetensors.TensorInfo.read
    record = lambda info, *args: read.append(stored_read(info, *args)) or read[-1]
    with mock.patch.object(safetensors.TensorInfo, "read", record):
      tensor.read(np.float32, (slice(10, 20), slice(40, 60)))  # Ten rows, columns inside the second group.
    self.assertCountEqual([r.shape for r in read], [(10, 10), (10, 1)])  # Two values a byte; one scale a row.

  def test_low_nibble_first_and_the_power_of_two(self):
    packed = np.zeros((1, 16), np.int8)
    packed[0, 0] = np.uint8(0x2A).view(np.int8)  # Low nibble 0xA (-1.0), high nibble 0x2 (1.0).
    scale = np.full((1, 1), 2.0, ml_dtypes.float8_e8m0fnu)
    value = _fp4(packed, scale).read(np.float32)
    self.assertEqual(value.shape, (1, 32))
    np.testing.assert_array_equal(value[0, :3], [-2.0, 2.0, 0.0])
    packed[0, 1] = np.uint8(0xF7).view(np.int8)  # 6.0, then -6.0: the ends of the table.
    np.testing.assert_array_equal(_fp4(packed, scale).read(np.float32)[0, 2:4], [12.0, -12.0])

  def test_errors_name_the_tensor_and_the_reason(self):
    with self.assertRaisesRegex(ConversionError, r"'w.weight' \(300, 80\).*'w.scale' \(300, 4\).*need scales"
                                r" \(300, 5\)"):
      _fp4(self.packed, self.scales[:, :4])
    with self.assertRaisesRegex(ConversionError, r"'w.weight' \(300, 40\).*80 values per row need a multiple of 32"):
      _fp4(self.packed[:, :40], self.scales[:, :2])
    with self.assertRaisesRegex(ConversionError, r"'w.weight' \(I8\) and its scale 'w.scale' \(F32\) must be"):
      _fp4(self.packed, self.scales.astype(np.float32))


if __name__ == "__main__":
  absltest.main()
