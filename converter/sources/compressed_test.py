"""compressed-tensors weights: every region dequantizes to what compressed-tensors' own decompressor gives (INT4
packed as Kimi ships it, 8 and 2 bits, odd widths and partial groups), FP8 and INT8 per tensor, channel and block
equal float32(code) x scale, and every malformed checkpoint or unsupported scheme is refused by name."""

import copy
import os
import sys
import tempfile
from unittest import mock

# Run as a script, this directory (symlinks resolved, as Python puts it there) comes first on the path, and its
# safetensors.py would stand in for the safetensors package compressed-tensors imports.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.realpath(entry or ".") != _HERE]

import ml_dtypes  # pylint: disable=g-import-not-at-top,g-bad-import-order
import numpy as np
import torch
from absl.testing import absltest, parameterized
from compressed_tensors.compressors.pack_quantized import helpers
from compressed_tensors.compressors.naive_quantized.base import NaiveQuantizationCompressor
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

from converter.errors import ConversionError
from converter.sources import compressed, open_source, safetensors, scaled
from tools.safetensors_writer import write_safetensors

MODULE = "model.layers.1.mlp.experts.3.down_proj"


def _config(weights: dict, fmt: str = "pack-quantized", **extra) -> dict:
  return {"quantization_config": {
      "quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
      "ignore": ["re:.*self_attn.*", "lm_head"],
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None}}, **extra}}


def _int_args(bits: int = 4, strategy: str = "group", group_size: int | None = 16) -> dict:
  return dict(num_bits=bits, type="int", symmetric=True, strategy=strategy, group_size=group_size, dynamic=False,
              actorder=None, observer="minmax")


def _packed(rows: int, cols: int, args: dict, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """A module's tensors as compressed-tensors writes them (BF16 scales spread over 2^-3..2^4, codes over their
  whole range; its compressor where the groups divide the row, else its packer), and the float32 weight of the
  codes its own unpacker reads times their scales (its decompressor multiplies in the scales' dtype: bfloat16)."""
  rng = np.random.default_rng(seed)
  bits, group = args["num_bits"], args["group_size"] or cols
  groups = 1 if args["strategy"] == "channel" else -(-cols // group)
  scale = (0.01 * 2.0 ** rng.integers(-3, 5, (rows, groups))).astype(ml_dtypes.bfloat16)
  codes = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), (rows, cols)).astype(np.int8)
  spread = lambda s: np.repeat(s.astype(np.float32), group, axis=1)[:, :cols]
  if cols % group == 0:
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**args))
    weight = torch.from_numpy(codes.astype(np.float32) * spread(scale))
    packed = PackedQuantizationCompressor.compress(
        {"weight": weight, "weight_scale": torch.from_numpy(scale.astype(np.float32)).bfloat16()},
        scheme)["weight_packed"]
  else:
    packed = helpers.pack_to_int32(torch.from_numpy(codes), bits)
  unpacked = helpers.unpack_from_int32(packed, bits, torch.Size((rows, cols))).numpy()
  np.testing.assert_array_equal(unpacked, codes)
  tensors = {f"{MODULE}.weight_packed": packed.numpy(), f"{MODULE}.weight_scale": scale,
             f"{MODULE}.weight_shape": np.array([rows, cols], np.int64)}
  return tensors, unpacked.astype(np.float32) * spread(scale)


def _source(tensors: dict, config: dict):
  directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
  write_safetensors(os.path.join(directory, "model.safetensors"), tensors)
  return open_source(directory, config, "config.json")


class PackedTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("int4_groups_of_16_odd_width", 4, "group", 16, 37, 100),  # 100 inputs: a partial group, a padded word.
      ("int4_kimi_groups_of_32", 4, "group", 32, 40, 256),
      ("int8_per_channel", 8, "channel", None, 20, 70),
      ("int2_groups_of_8", 2, "group", 8, 12, 40),
  )
  def test_every_region_equals_compressed_tensors_decompression(self, bits, strategy, group, rows, cols):
    args = _int_args(bits, strategy, group)
    tensors, expected = _packed(rows, cols, args)
    tensors["model.norm.weight"] = np.ones(4, ml_dtypes.bfloat16)
    source = _source(tensors, _config(args))
    self.assertEqual(sorted(source.tensors), [f"{MODULE}.weight", "model.norm.weight"])
    tensor = source.tensors[f"{MODULE}.weight"]
    self.assertEqual((tensor.shape, tensor.dtype), ((rows, cols), np.float32))
    np.testing.assert_array_equal(tensor.read(), expected)
    with mock.patch.object(scaled, "PIECE_VALUES", 24):  # Pieces within a row, across group edges.
      np.testing.assert_array_equal(tensor.read(np.float32), expected)
      for region in [(slice(3, 17),), (5,), (slice(0, rows), slice(9, 61)), (slice(1, 2), slice(cols - 3, cols))]:
        np.testing.assert_array_equal(tensor.read(np.float32, region), expected[region])
      np.testing.assert_array_equal(tensor.read(np.float32, (slice(2, 9),), transpose=True), expected[2:9].T)
    bf16 = tensor.read(ml_dtypes.bfloat16)  # Rounded once, from the exact float32 product.
    np.testing.assert_array_equal(bf16, expected.astype(ml_dtypes.bfloat16))

  def test_high_nibble_first_or_twos_complement_would_differ(self):
    """Element c of a row sits in bits 4 (c % 8) of word c // 8 and holds q + 8."""
    words = np.array([[0x76543210, 0xFEDCBA98]], np.uint32).view(np.int32)
    tensors = {f"{MODULE}.weight_packed": words, f"{MODULE}.weight_scale": np.full((1, 1), 0.5, np.float32),
               f"{MODULE}.weight_shape": np.array([1, 16], np.int64)}
    args = _int_args(group_size=16)
    value = _source(tensors, _config(args)).tensors[f"{MODULE}.weight"].read()
    np.testing.assert_array_equal(value, 0.5 * (np.arange(16, dtype=np.float32) - 8)[None])

  def test_weight_shape_decides_the_width_and_must_fit_the_words(self):
    args = _int_args()
    tensors, expected = _packed(8, 96, args)
    tensors[f"{MODULE}.weight_shape"] = np.array([8, 90], np.int32)  # Also 12 words a row: the last 6 codes pad.
    tensor = _source(tensors, _config(args)).tensors[f"{MODULE}.weight"]
    np.testing.assert_array_equal(tensor.read(), expected[:, :90])
    tensors[f"{MODULE}.weight_shape"] = np.array([8, 120], np.int32)
    with self.assertRaisesRegex(ConversionError, r"weight_shape' says the weight is \[8, 120\], but .*weight_packed'"
                                r" is \(8, 12\).* would be \(8, 15\)"):
      _source(tensors, _config(args))

  def test_one_weight_shape_a_layout_is_read_at_open_each_other_before_its_values(self):
    args = _int_args()
    tensors, expected = _packed(8, 96, args)
    other = MODULE.replace("experts.3", "experts.4")
    tensors.update({k.replace(MODULE, other): v for k, v in tensors.items()})
    read = []
    stored_read = safetensors.TensorInfo.read
    record = lambda info, *args: read.append(info.name) or stored_read(info, *args)
    with mock.patch.object(safetensors.TensorInfo, "read", record):
      source = _source(tensors, _config(args))
    self.assertEqual(read, [f"{MODULE}.weight_shape"])
    np.testing.assert_array_equal(source.tensors[f"{other}.weight"].read(), expected)
    tensors[f"{other}.weight_shape"] = np.array([8, 90], np.int32)  # Fits the words, but not its layout's shape.
    tensor = _source(tensors, _config(args)).tensors[f"{other}.weight"]
    self.assertEqual(tensor.shape, (8, 96))
    with self.assertRaisesRegex(ConversionError, rf"'{other}.weight_shape' says the weight is \[8, 90\].* \[8, 96\]"):
      tensor.read()

  def test_bad_tensors_are_refused_by_name(self):
    args = _int_args()
    good, _ = _packed(8, 96, args)
    cases = {
        "missing scale": ({k: v for k, v in good.items() if not k.endswith("scale")}, r"has no '.*weight_scale'"),
        "missing shape": ({k: v for k, v in good.items() if not k.endswith("shape")}, r"needs '.*weight_shape'"),
        "scale grid": ({**good, f"{MODULE}.weight_scale": np.ones((8, 5), ml_dtypes.bfloat16)},
                       r"weight_scale' is \(8, 5\).* need \(8, 6\)"),
        "packed dtype": ({**good, f"{MODULE}.weight_packed": good[f"{MODULE}.weight_packed"].view(np.float32)},
                         r"weight_packed'.* is F32 .*expected a 2-D I32"),
        "zero point": ({**good, f"{MODULE}.weight_zero_point": np.zeros((1, 6), np.int32)}, r"weight_zero_point"),
        "stray scale": ({**good, "model.layers.0.mlp.gate_proj.weight_scale": np.ones((2, 1), np.float32)},
                        r"gate_proj.weight_scale' belongs to a quantized weight"),
        "ignored module": ({f"model.layers.0.self_attn.o_proj.{k.rsplit('.', 1)[1]}": v for k, v in good.items()},
                           r"ignore .* leaves module 'model.layers.0.self_attn.o_proj' unquantized"),
    }
    for what, (tensors, message) in cases.items():
      with self.subTest(what), self.assertRaisesRegex(ConversionError, message):
        _source(tensors, _config(args))

  def test_schemes_it_cannot_read_exactly_are_refused_by_key(self):
    tensors, _ = _packed(8, 96, _int_args())
    base = _config(_int_args())
    cases = {
        "weights.strategy 'tensor_group'": {"strategy": "tensor_group"},
        "weights.symmetric False": {"symmetric": False},
        "weights.actorder 'group'": {"actorder": "group"},
        "weights.num_bits 3": {"num_bits": 3},
        "weights.group_size None": {"group_size": None},
    }
    for message, change in cases.items():
      config = copy.deepcopy(base)
      config["quantization_config"]["config_groups"]["group_0"]["weights"].update(change)
      with self.subTest(message), self.assertRaisesRegex(ConversionError, rf"group_0\.{message}"):
        _source(tensors, config)
    for key, value, message in (("format", "nvfp4-pack-quantized", "format 'nvfp4-pack-quantized'"),
                                ("quantization_status", "frozen", "quantization_status 'frozen'"),
                                ("transform_config", {"config_groups": {}}, "transform_config is set")):
      config = copy.deepcopy(base)
      config["quantization_config"][key] = value
      with self.subTest(key), self.assertRaisesRegex(ConversionError, message):
        _source(tensors, config)

  def test_targets_and_ignore_choose_the_scheme(self):
    """A regex target wins over the class name "Linear"; a module no group targets is refused."""
    int4, _ = _packed(8, 96, _int_args(group_size=32))
    config = _config(_int_args(group_size=16))
    config["quantization_config"]["config_groups"]["experts"] = {
        "targets": [r"re:.*mlp\.experts\..*"], "weights": _int_args(group_size=32)}
    tensor = _source(int4, config).tensors[f"{MODULE}.weight"]
    self.assertEqual(tensor.scheme.group_size, 32)
    config["quantization_config"]["config_groups"] = {"experts": {"targets": ["re:.*shared.*"], "weights":
                                                                  _int_args(group_size=32)}}
    with self.assertRaisesRegex(ConversionError, f"no config group .* targets module '{MODULE}'"):
      _source(int4, config)


FUSED = "model.layers.1.mlp.experts.gate_up_proj"


class FusedExpertsTest(absltest.TestCase):
  """Fused experts (experts, out, in) written by compressed-tensors 0.20.0's own compressors, which pack and scale
  every expert's slice as a Linear's: presented as the fused parameter, each region equal to its own unpacking."""

  def _assert_regions(self, tensor, expected) -> None:
    self.assertEqual((tensor.shape, tensor.dtype), (expected.shape, np.float32))
    np.testing.assert_array_equal(tensor.read(), expected)
    with mock.patch.object(scaled, "PIECE_VALUES", 24):  # Pieces within a row, across group edges and experts.
      for region in [(1,), (slice(1, 3),), (2, slice(3, 9)), (slice(0, 3), slice(1, 5), slice(13, 47))]:
        np.testing.assert_array_equal(tensor.read(np.float32, region), expected[region])
      np.testing.assert_array_equal(tensor.read(np.float32, (slice(1, 3),), transpose=True),
                                    expected[1:3].transpose(0, 2, 1))
    np.testing.assert_array_equal(tensor.read(ml_dtypes.bfloat16), expected.astype(ml_dtypes.bfloat16))

  def test_int4_packed_with_groups(self):
    experts, rows, cols, group = 3, 10, 48, 16
    rng = np.random.default_rng(1)
    scale = (0.01 * 2.0 ** rng.integers(-3, 5, (experts, rows, cols // group))).astype(ml_dtypes.bfloat16)
    codes = rng.integers(-8, 8, (experts, rows, cols)).astype(np.float32)
    spread = np.repeat(scale.astype(np.float32), group, axis=-1)
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**_int_args(4, "group", group)))
    stored = PackedQuantizationCompressor.compress(
        {"weight": torch.from_numpy(codes * spread), "weight_scale": torch.from_numpy(spread[..., ::group]).bfloat16()},
        scheme)
    self.assertEqual(tuple(stored["weight_shape"].tolist()), (experts, rows, cols))
    unpacked = helpers.unpack_from_int32(stored["weight_packed"], 4, torch.Size((experts, rows, cols))).numpy()
    tensors = {f"{FUSED}.weight_packed": stored["weight_packed"].numpy(), f"{FUSED}.weight_scale": scale,
               f"{FUSED}.weight_shape": stored["weight_shape"].numpy()}
    source = _source(tensors, _config(_int_args(4, "group", group)))
    self.assertEqual(sorted(source.tensors), [FUSED])
    self._assert_regions(source.tensors[FUSED], unpacked.astype(np.float32) * spread)

    with self.assertRaisesRegex(ConversionError, r"weight_shape' says the weight is \[3, 10, 40\].* would be"
                                r" \(3, 10, 5\)"):
      _source({**tensors, f"{FUSED}.weight_shape": np.array([3, 10, 40])}, _config(_int_args(4, "group", group)))
    with self.assertRaisesRegex(ConversionError, r"needs '.*gate_up_proj.weight_shape', I32 or I64 of shape \(3,\)"
                                r" \(\[experts, out, in\]\); found I64 \(2,\)"):
      _source({**tensors, f"{FUSED}.weight_shape": np.array([10, 48])}, _config(_int_args(4, "group", group)))
    with self.assertRaisesRegex(ConversionError, r"weight_scale' is \(3, 10, 2\).* need \(3, 10, 3\)"):
      _source({**tensors, f"{FUSED}.weight_scale": scale[..., :2]}, _config(_int_args(4, "group", group)))

  def test_fp8_per_channel_and_per_tensor(self):
    experts, rows, cols = 3, 10, 48
    rng = np.random.default_rng(2)
    weight = torch.from_numpy(rng.normal(0, 0.05, (experts, rows, cols)).astype(np.float32))
    for strategy, scale_shape in (("channel", (experts, rows, 1)), ("tensor", (1,))):
      with self.subTest(strategy):
        args = dict(num_bits=8, type="float", symmetric=True, strategy=strategy, dynamic=False)
        scale = torch.from_numpy((0.01 * 2.0 ** rng.integers(-2, 3, scale_shape)).astype(np.float32))
        stored = NaiveQuantizationCompressor.compress(
            {"weight": weight, "weight_scale": scale},
            QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**args)))
        codes = stored["weight"].view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
        tensors = {f"{FUSED}.weight": codes, f"{FUSED}.weight_scale": stored["weight_scale"].numpy()}
        source = _source(tensors, _config(args, "float-quantized"))
        self.assertEqual(sorted(source.tensors), [FUSED])
        expected = codes.astype(np.float32) * stored["weight_scale"].numpy().astype(np.float32)
        self._assert_regions(source.tensors[FUSED], expected)

  def test_block_scales_and_a_tensor_stored_twice_are_refused(self):
    args = dict(num_bits=8, type="float", symmetric=True, strategy="block", block_structure=[8, 16], dynamic=False)
    codes = np.zeros((2, 8, 16), ml_dtypes.float8_e4m3fn)
    with self.assertRaisesRegex(ConversionError, "fused experts .* group, channel or tensor scales only"):
      _source({f"{FUSED}.weight": codes, f"{FUSED}.weight_scale": np.ones((2, 1, 1), np.float32)},
              _config(args, "float-quantized"))
    args = dict(args, strategy="channel", block_structure=None)
    with self.assertRaisesRegex(ConversionError, f"'{FUSED}' is stored both as it is and quantized"):
      _source({f"{FUSED}.weight": codes, f"{FUSED}.weight_scale": np.ones((2, 8, 1), np.float32),
               FUSED: np.zeros((2, 8, 16), np.float32)}, _config(args, "float-quantized"))


class ScaledCodesTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("fp8_per_tensor", "float-quantized", "tensor", None, ml_dtypes.float8_e4m3fn, (1,)),
      ("fp8_per_channel", "float-quantized", "channel", None, ml_dtypes.float8_e4m3fn, (30, 1)),
      ("fp8_blocks", "float-quantized", "block", [16, 32], ml_dtypes.float8_e4m3fn, (2, 3)),
      ("int8_per_channel", "int-quantized", "channel", None, np.int8, (30, 1)),
  )
  def test_codes_times_their_scale(self, fmt, strategy, block, dtype, scale_shape):
    rng = np.random.default_rng(1)
    if dtype == np.int8:
      codes = rng.integers(-128, 128, (30, 70)).astype(np.int8)
    else:
      codes = rng.standard_normal((30, 70)).astype(np.float32).astype(dtype)
    scale = (rng.random(scale_shape) + 0.5).astype(np.float32)
    br, bc = {"tensor": (30, 70), "channel": (1, 70), "block": tuple(block or (1, 1))}[strategy]
    expected = codes.astype(np.float32) * np.repeat(np.repeat(scale.reshape(
        scale_shape if len(scale_shape) == 2 else (1, 1)), br, 0), bc, 1)[:30, :70]
    args = dict(num_bits=8, type="int" if dtype == np.int8 else "float", symmetric=True, strategy=strategy,
                block_structure=block, dynamic=False)
    tensors = {"model.layers.0.mlp.down_proj.weight": codes, "model.layers.0.mlp.down_proj.weight_scale": scale,
               "model.layers.0.mlp.down_proj.input_scale": np.ones(1, np.float32)}  # Activations: not the model's.
    source = _source(tensors, _config(args, fmt))
    self.assertEqual(list(source.tensors), ["model.layers.0.mlp.down_proj.weight"])
    tensor = source.tensors["model.layers.0.mlp.down_proj.weight"]
    np.testing.assert_array_equal(tensor.read(), expected)
    with mock.patch.object(scaled, "PIECE_VALUES", 40):
      np.testing.assert_array_equal(tensor.read(np.float32, (slice(7, 29), slice(5, 66))), expected[7:29, 5:66])
      np.testing.assert_array_equal(tensor.read(np.float32, (slice(3, 5),), transpose=True), expected[3:5].T)


class MixedPrecisionTest(absltest.TestCase):

  def test_each_group_is_read_in_its_own_format(self):
    """`format: mixed-precision`: INT4 experts packed, FP8 attention per channel, each group naming its format."""
    int4 = _int_args(group_size=16)
    tensors, expected = _packed(8, 48, int4)
    rng = np.random.default_rng(2)
    codes = rng.standard_normal((6, 48)).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    scale = (rng.random((6, 1)) + 0.5).astype(np.float32)
    attention = "model.layers.1.self_attn.o_proj"
    tensors.update({f"{attention}.weight": codes, f"{attention}.weight_scale": scale})
    config = _config(int4, "mixed-precision")
    quantization = config["quantization_config"]
    quantization["ignore"] = []
    quantization["config_groups"] = {
        "experts": {"targets": [r"re:.*mlp\.experts.*"], "weights": int4, "format": "pack-quantized"},
        "attention": {"targets": [r"re:.*self_attn.*"], "format": "float-quantized",
                      "weights": dict(num_bits=8, type="float", symmetric=True, strategy="channel")}}
    source = _source(tensors, config)
    np.testing.assert_array_equal(source.tensors[f"{MODULE}.weight"].read(), expected)
    np.testing.assert_array_equal(source.tensors[f"{attention}.weight"].read(), codes.astype(np.float32) * scale)
    del quantization["config_groups"]["attention"]["format"]
    with self.assertRaisesRegex(ConversionError, "format 'mixed-precision' \\(group attention\\)"):
      _source(tensors, config)


class KimiLayoutTest(absltest.TestCase):

  def test_the_quantization_config_under_text_config_is_read(self):
    """K2.5 / K2.6 keep quantization_config in text_config, their text model under `language_model.`."""
    args = _int_args(group_size=16)
    tensors, expected = _packed(8, 48, args)
    tensors = {f"language_model.{k}": v for k, v in tensors.items()}
    tensors["vision_tower.encoder.final_layernorm.weight"] = np.ones(4, ml_dtypes.bfloat16)
    config = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": _config(args)}
    config["text_config"]["quantization_config"]["ignore"].append("re:vision_tower.*")
    source = _source(tensors, config)
    self.assertEqual(source.quant_method, compressed.QUANT_METHOD)
    np.testing.assert_array_equal(source.tensors[f"language_model.{MODULE}.weight"].read(), expected)


if __name__ == "__main__":
  absltest.main()
