"""FP8 block-scaled weights: any region dequantizes to the same values as the whole tensor, which equals an
independent numpy dequantization (tools/quantize.py), partial blocks and every scale dtype included."""

import os
import tempfile
from unittest import mock

import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized

from converter.errors import ConversionError
from converter.sources import fp4, fp8, open_safetensors, open_source, safetensors, scaled
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

  def test_pieces_of_block_rows_read_and_transposed_equal_the_numpy_dequantization(self):
    # Pieces of one 32x32 block (and a partial one at the end) instead of the default's 16: the piece loop, its
    # scale slicing and its transposed placement are exercised on a small tensor, regions off the block edges.
    values, scales = quantize.fp8_block_quantize(self.weight, (32, 32))
    expected = quantize.fp8_dequantize(values, scales, (32, 32))
    tensor = _source({"w.weight": values, "w.weight_scale_inv": scales}, block=(32, 32)).tensors["w.weight"]
    with mock.patch.object(scaled, "PIECE_VALUES", 32 * 32):
      for region in [(), (slice(5, 190),), (slice(31, 33), slice(17, 383)), (slice(0, 200), slice(40, 41))]:
        np.testing.assert_array_equal(tensor.read(np.float32, region), expected[region])
        np.testing.assert_array_equal(tensor.read(np.float32, region, transpose=True),
                                      np.ascontiguousarray(expected[region].T))

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
    with self.assertRaisesRegex(ConversionError, "'n.weight_scale_inv' is a block scale, but its weight 'n.weight'"
                                " has dtype F32, not FP8"):
      _source({"n.weight": np.ones(4, np.float32), "n.weight_scale_inv": np.ones(1, np.float32)})
    directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    write_safetensors(os.path.join(directory, "model.safetensors"), {"w.weight": self.values})
    with self.assertRaisesRegex(ConversionError, "weight_block_size.*never inferred"):
      fp8.fp8_source(open_safetensors(directory), {"quant_method": "fp8"}, "config.json")


class Deepseek4SourceTest(absltest.TestCase):
  """DeepSeek V4 as the hub ships it: FP8 with F8_E8M0 `.scale` siblings, routed experts packed FP4, F32 mixers."""

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(1)
    # 200 x 100 in 128x128 blocks: a (2, 1) grid whose last row of blocks is partial (72 rows).
    self.weight = (rng.standard_normal((200, 100)) * 0.02).astype(np.float32)
    self.values, self.scales = quantize.fp8_block_quantize(self.weight, (128, 128), ml_dtypes.float8_e8m0fnu)
    self.packed, self.packed_scales = quantize.fp4_pack(rng.standard_normal((48, 64)).astype(np.float32))
    self.mixer = rng.standard_normal((15, 96)).astype(np.float32)
    self.stored = {
        "layers.0.attn.wq_a.weight": self.values, "layers.0.attn.wq_a.scale": self.scales,
        "layers.0.ffn.experts.0.w1.weight": self.packed, "layers.0.ffn.experts.0.w1.scale": self.packed_scales,
        "layers.0.hc_attn_fn": self.mixer, "layers.0.attn.attn_sink": self.mixer[0],
        "layers.0.ffn.gate.tid2eid": np.arange(12, dtype=np.int64).reshape(6, 2),
        "layers.0.attn_norm.weight": self.mixer[1].astype(ml_dtypes.bfloat16),
    }
    self.quantization = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}

  def _open(self, tensors=None, quantization=None, **top_level):
    directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    write_safetensors(os.path.join(directory, "model.safetensors"), self.stored if tensors is None else tensors)
    config = {"quantization_config": quantization or self.quantization, **top_level}
    return open_source(directory, config, "config.json")

  def test_both_config_forms_read_the_same(self):
    hub = self._open(expert_dtype="fp4")  # The hub: expert_dtype beside quantization_config.
    inside = self._open(quantization=dict(self.quantization, expert_dtype="fp4"))  # transformers 5.24.
    for source in (hub, inside):
      self.assertEqual(sorted(source.tensors), sorted(n for n in self.stored if not n.endswith(".scale")))
      wq_a, expert = source.tensors["layers.0.attn.wq_a.weight"], source.tensors["layers.0.ffn.experts.0.w1.weight"]
      self.assertEqual(wq_a.format, "F8_E4M3 x F8_E8M0 scales, 128x128 blocks")
      self.assertEqual(wq_a.stored_names, ("layers.0.attn.wq_a.weight", "layers.0.attn.wq_a.scale"))
      np.testing.assert_array_equal(wq_a.read(np.float32), quantize.fp8_dequantize(self.values, self.scales,
                                                                                   (128, 128)))
      self.assertIsInstance(expert, fp4.Fp4Tensor)
      self.assertEqual(expert.shape, (48, 64))
      np.testing.assert_array_equal(expert.read(np.float32), quantize.fp4_dequantize(self.packed,
                                                                                     self.packed_scales))

  def test_unquantized_tensors_keep_their_dtype_and_bits(self):
    source = self._open(expert_dtype="fp4")
    for name in ("layers.0.hc_attn_fn", "layers.0.attn.attn_sink", "layers.0.ffn.gate.tid2eid",
                 "layers.0.attn_norm.weight"):
      tensor = source.tensors[name]
      self.assertEqual(tensor.format, {np.float32: "F32", np.int64: "I64"}.get(self.stored[name].dtype.type, "BF16"))
      self.assertEqual(tensor.read().tobytes(), self.stored[name].tobytes(), name)

  def test_base_checkpoints_ship_fp8_experts(self):
    tensors = {"layers.0.ffn.experts.0.w2.weight": self.values, "layers.0.ffn.experts.0.w2.scale": self.scales}
    expert = self._open(tensors, expert_dtype="fp8").tensors["layers.0.ffn.experts.0.w2.weight"]
    self.assertIsInstance(expert, fp8.Fp8BlockTensor)
    np.testing.assert_array_equal(expert.read(np.float32, (slice(120, 140),)),
                                  quantize.fp8_dequantize(self.values, self.scales, (128, 128))[120:140])

  def test_errors_name_the_file_the_tensor_and_the_reason(self):
    expert = "layers.0.ffn.experts.0.w1"
    without = lambda *names: {n: v for n, v in self.stored.items() if n not in names}
    with self.assertRaisesRegex(ConversionError, r"model.safetensors: 'layers.0.ffn.experts.0.w1.scale' is a block"
                                r" scale, but its weight .* has dtype I8, not FP8 \(packed FP4 weights need"
                                " expert_dtype: fp4"):
      self._open()  # No expert_dtype: an I8 weight is not known to be packed FP4.
    with self.assertRaisesRegex(ConversionError, f"'{expert}.weight' is I8 but has no '{expert}.weight_scale_inv'"
                                f" or '{expert}.scale'"):
      self._open(without(f"{expert}.scale"), expert_dtype="fp4")
    with self.assertRaisesRegex(ConversionError, "'layers.0.attn.wq_a.weight' is F8_E4M3 but has no"):
      self._open(without("layers.0.attn.wq_a.scale"), expert_dtype="fp4")
    with self.assertRaisesRegex(ConversionError, "'layers.0.attn.wq_a.scale' is a block scale, but its weight"
                                " 'layers.0.attn.wq_a.weight' is missing"):
      self._open(without("layers.0.attn.wq_a.weight"), expert_dtype="fp4")
    with self.assertRaisesRegex(ConversionError, r"'layers.0.attn.wq_a.scale' has shape \(1, 1\), but weight"
                                r" .* \(200, 100\) in 128x128 blocks .* needs \(2, 1\)"):
      self._open(dict(self.stored, **{"layers.0.attn.wq_a.scale": self.scales[:1]}), expert_dtype="fp4")
    with self.assertRaisesRegex(ConversionError, r"packed FP4 weight '.*w1.weight' \(48, 32\).*\(48, 1\).*need"
                                r" scales \(48, 2\)"):
      self._open(dict(self.stored, **{f"{expert}.scale": self.packed_scales[:, :1]}), expert_dtype="fp4")
    with self.assertRaisesRegex(ConversionError, "has two scales, 'layers.0.attn.wq_a.weight_scale_inv' and"):
      self._open(dict(self.stored, **{"layers.0.attn.wq_a.weight_scale_inv": self.scales}), expert_dtype="fp4")
    with self.assertRaisesRegex(ConversionError, "config.json: quantization_config expert_dtype 'int4' is not"
                                " supported; supported: fp8, fp4"):
      self._open(expert_dtype="int4")
    with self.assertRaisesRegex(ConversionError, "config.json: quantization_config scale_fmt 'e5m2' is not"):
      self._open(quantization=dict(self.quantization, scale_fmt="e5m2"), expert_dtype="fp4")
    with self.assertRaisesRegex(ConversionError, "config.json: expert_dtype is 'fp4' but quantization_config"
                                ".expert_dtype is 'fp8'"):
      self._open(quantization=dict(self.quantization, expert_dtype="fp8"), expert_dtype="fp4")

  def test_a_scale_named_parameter_of_another_dtype_is_a_tensor(self):
    tensors = {"norm.weight": self.mixer[0], "norm.scale": self.mixer[1]}  # F32 beside F32: not a block scale.
    self.assertEqual(sorted(self._open(tensors, expert_dtype="fp4").tensors), ["norm.scale", "norm.weight"])


if __name__ == "__main__":
  absltest.main()
