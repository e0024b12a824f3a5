"""MXFP4 experts: packed e2m1 nibbles (low first) times 2^(scale - 127), presented in HF's (experts, in, out)
layout; regions equal the whole tensor, which equals an independent numpy dequantization (tools/quantize.py)."""

import os
import tempfile
from unittest import mock

import ml_dtypes
import numpy as np
from absl.testing import absltest

from converter.errors import ConversionError
from converter.sources import mxfp4, open_safetensors, safetensors
from tools import quantize
from tools.safetensors_writer import write_safetensors


def _source(tensors):
  directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
  write_safetensors(os.path.join(directory, "model.safetensors"), tensors)
  return mxfp4.mxfp4_source(open_safetensors(directory), {"quant_method": "mxfp4"}, "config.json")


class Mxfp4SourceTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    weight = np.random.default_rng(0).standard_normal((3, 96, 40)).astype(np.float32)  # (experts, in, out)
    self.blocks, self.scales = quantize.mxfp4_pack(weight)
    self.expected = quantize.mxfp4_dequantize(self.blocks, self.scales)

  def test_whole_tensor_and_regions_equal_the_numpy_dequantization(self):
    tensor = _source({"x.gate_up_proj_blocks": self.blocks, "x.gate_up_proj_scales": self.scales}).tensors[
        "x.gate_up_proj"]
    self.assertEqual(tensor.shape, (3, 96, 40))
    np.testing.assert_array_equal(tensor.read(np.float32), self.expected)
    for region in [(1,), (slice(1, 3),), (2, slice(20, 70)), (0, slice(95, 96))]:
      np.testing.assert_array_equal(tensor.read(np.float32, region), self.expected[region])
    # Every value is an e2m1 number times a power of two: exact in bfloat16.
    np.testing.assert_array_equal(tensor.read().astype(np.float32), self.expected)
    self.assertEqual(tensor.read().dtype, ml_dtypes.bfloat16)

  def test_transposed_reads_swap_the_last_two_axes(self):
    tensor = _source({"x_blocks": self.blocks, "x_scales": self.scales}).tensors["x"]
    for region in [(), (1,), (slice(1, 3), slice(20, 70)), (2, slice(31, 96), slice(5, 39))]:
      for dtype in (np.float32, ml_dtypes.bfloat16):
        value = tensor.read(dtype, region, transpose=True)
        np.testing.assert_array_equal(value.astype(np.float32), np.swapaxes(self.expected[region], -1, -2),
                                      f"{region} {np.dtype(dtype)}")
        self.assertTrue(value.flags.c_contiguous)

  def test_a_region_reads_only_its_packed_bytes(self):
    tensor = _source({"x_blocks": self.blocks, "x_scales": self.scales}).tensors["x"]
    read = []
    stored_read = safetensors.TensorInfo.read
    record = lambda info, *args: read.append(stored_read(info, *args)) or read[-1]
    with mock.patch.object(safetensors.TensorInfo, "read", record):
      tensor.read(np.float32, (1, slice(32, 64)))  # One expert, one group of 32 input rows.
    self.assertEqual(sum(r.nbytes for r in read), (self.blocks.nbytes + self.scales.nbytes) // 3 // 3)

  def test_low_nibble_first_and_the_scale_bias(self):
    blocks = np.zeros((1, 1, 16), np.uint8)
    blocks[0, 0, 0] = 0x2A  # Low nibble 0xA (-1.0), high nibble 0x2 (1.0).
    scales = np.full((1, 1), 128, np.uint8)  # 2^(128 - 127) = 2.
    value = _source({"w_blocks": blocks, "w_scales": scales}).tensors["w"].read(np.float32)
    self.assertEqual(value.shape, (32, 1))
    np.testing.assert_array_equal(value[:3, 0], [-2.0, 2.0, 0.0])

  def test_errors_name_the_tensor_and_the_reason(self):
    with self.assertRaisesRegex(ConversionError, "'x_blocks' has no 'x_scales'"):
      _source({"x_blocks": self.blocks})
    with self.assertRaisesRegex(ConversionError, "must both be U8"):
      _source({"x_blocks": self.blocks, "x_scales": self.scales.astype(np.float32)})


if __name__ == "__main__":
  absltest.main()
