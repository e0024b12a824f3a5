"""FP8 block-scaled weights: any region dequantizes to the same values as the whole tensor, which equals an
independent numpy dequantization (tools/quantize.py), partial blocks and every scale dtype included."""

import os
import tempfile
from unittest import mock

import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized

from converter.errors import ConversionError
from converter.sources import fp8, open_safetensors, safetensors
from tools import quantize
from tools.safetensors_writer import write_safetensors


def _source(tensors, block=(128, 128)):
  directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
  write_safetensors(os.path.join(directory, "model.safetensors"), tensors)
  return fp8.fp8_source(open_safetensors(directory), {"quant_method": "fp8", "weight_block_size": list(block)},
                        "config.json")


class Fp8SourceTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(0)
    # The contract's example: 200 rows in 128-row blocks (2 scale rows, the second partial), 384 columns.
    self.weight = (rng.standard_normal((200, 384)) * 0.02).astype(np.float32)
    self.values, self.scales = quantize.fp8_block_quantize(self.weight, (128, 128))
    self.expected = quantize.fp8_dequantize(self.values, self.scales, (128, 128))

  def test_whole_tensor_and_regions_equal_the_numpy_dequantization(self):
    tensor = _source({"w.weight": self.values, "w.weight_scale_inv": self.scales,
                      "norm.weight": np.ones(4, np.float32)}).tensors["w.weight"]
    self.assertEqual((tensor.shape, tensor.format), ((200, 384), "F8_E4M3 x F32 scales, 128x128 blocks"))
    np.testing.assert_array_equal(tensor.read(np.float32), self.expected)
    for region in [(slice(100, 200),), (slice(127, 129),), (150,), (slice(0, 200), slice(120, 260))]:
      np.testing.assert_array_equal(tensor.read(np.float32, region), self.expected[region])

  def test_rounded_once_to_the_dtype_asked_for(self):
    tensor = _source({"w.weight": self.values, "w.weight_scale_inv": self.scales}).tensors["w.weight"]
    np.testing.assert_array_equal(tensor.read(ml_dtypes.bfloat16).view(np.uint16),
                                  self.expected.astype(ml_dtypes.bfloat16).view(np.uint16))

  @parameterized.parameters(ml_dtypes.bfloat16, np.float16, ml_dtypes.float8_e8m0fnu)
  def test_scales_in_other_dtypes(self, dtype):
    scales = np.exp2(np.round(np.log2(self.scales))).astype(dtype)  # Representable in every dtype here.
    tensor = _source({"w.weight": self.values, "w.weight_scale_inv": scales}).tensors["w.weight"]
    np.testing.assert_array_equal(tensor.read(np.float32),
                                  quantize.fp8_dequantize(self.values, scales.astype(np.float32), (128, 128)))

  def test_stacked_experts_read_one_expert_at_a_time(self):
    values = np.stack([self.values, self.values[::-1]])
    scales = np.stack([self.scales, self.scales[::-1] * 2])
    tensor = _source({"e.weight": values, "e.weight_scale_inv": scales}).tensors["e.weight"]
    np.testing.assert_array_equal(tensor.read(np.float32, (1,)),
                                  quantize.fp8_dequantize(values[1], scales[1], (128, 128)))

  def test_a_region_reads_only_its_rows_and_their_scales(self):
    tensor = _source({"w.weight": self.values, "w.weight_scale_inv": self.scales}).tensors["w.weight"]
    read = []
    stored_read = safetensors.TensorInfo.read
    record = lambda info, *args: read.append(stored_read(info, *args)) or read[-1]
    with mock.patch.object(safetensors.TensorInfo, "read", record):
      tensor.read(np.float32, (slice(130, 140),))  # Ten rows of the second block row.
    self.assertCountEqual([r.shape for r in read], [(10, 384), (1, 3)])

  def test_every_fp8_byte_decodes_as_ml_dtypes_casts_it(self):
    for dtype in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
      codes = np.arange(256, dtype=np.uint8).view(dtype)
      for shape in ((256,), (16, 16), (4, 64), (2, 2, 64), (8, 32)[::-1]):
        values = np.resize(codes, shape)
        np.testing.assert_array_equal(fp8.to_float32(values), values.astype(np.float32))  # NaNs included.
      np.testing.assert_array_equal(fp8.to_float32(codes[:255]), codes[:255].astype(np.float32))  # Odd length.

  def test_scale_tensors_are_consumed(self):
    source = _source({"w.weight": self.values, "w.weight_scale_inv": self.scales})
    self.assertEqual(sorted(source.tensors), ["w.weight"])
    self.assertEqual(source.tensors["w.weight"].stored_names, ("w.weight", "w.weight_scale_inv"))

  def test_errors_name_the_tensor_and_the_reason(self):
    with self.assertRaisesRegex(ConversionError, "'w.weight' is F8_E4M3 but has no 'w.weight_scale_inv'"):
      _source({"w.weight": self.values})
    with self.assertRaisesRegex(ConversionError, r"has shape \(2, 3\).*64x64 blocks.*needs \(4, 6\)"):
      _source({"w.weight": self.values, "w.weight_scale_inv": self.scales}, block=(64, 64))
    with self.assertRaisesRegex(ConversionError, "'n.weight_scale_inv' is an FP8 block scale, but its weight"):
      _source({"n.weight": np.ones(4, np.float32), "n.weight_scale_inv": np.ones(1, np.float32)})
    directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    write_safetensors(os.path.join(directory, "model.safetensors"), {"w.weight": self.values})
    with self.assertRaisesRegex(ConversionError, "weight_block_size.*never inferred"):
      fp8.fp8_source(open_safetensors(directory), {"quant_method": "fp8"}, "config.json")


if __name__ == "__main__":
  absltest.main()
