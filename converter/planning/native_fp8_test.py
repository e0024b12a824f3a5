"""Native fp8 leaves: FP8 kernels as stored, scales where MaxText's dequantize_weight expects them (compared with
an independent expansion of the HF block grid), and refusals where MaxText's blocks cannot hold HF's."""

import os
import tempfile

import ml_dtypes
import numpy as np
from absl.testing import absltest

from converter import ops
from converter.planning import native_fp8
from converter.errors import ConversionError
from converter.planning.loaders import FromTensor, JoinSlots, Stack
from converter.planning.plan import Leaf
from converter.sources import fp8, open_safetensors
from tools import quantize
from tools.safetensors_writer import write_safetensors

FP8_OUTPUT = native_fp8.Fp8Output("float8_e4m3fn", 32, ("gate",))


def _tensors(shapes: dict[str, tuple[int, int]], block=(32, 32)):
  rng = np.random.default_rng(0)
  stored = {}
  for name, shape in shapes.items():
    stored[name], stored[name + "_scale_inv"] = quantize.fp8_block_quantize(
        rng.standard_normal(shape).astype(np.float32), block, ml_dtypes.bfloat16)
  directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
  write_safetensors(os.path.join(directory, "model.safetensors"), stored)
  source = fp8.fp8_source(open_safetensors(directory), {"weight_block_size": list(block)}, "config.json")
  return source.tensors, stored


def _from(tensor, op_list) -> FromTensor:
  return FromTensor(tensor, (), tuple(op_list), np.dtype(np.float32), ops.output_shape(tuple(op_list), tensor.shape))


def _maxtext_dequantize(kernel: np.ndarray, scale: np.ndarray) -> np.ndarray:
  """MaxText's rule, written out per element: scale value i covers elements i * d/s ... (i+1) * d/s - 1."""
  expanded = scale
  for axis, (d, s) in enumerate(zip(kernel.shape, scale.shape)):
    expanded = np.repeat(expanded, d // s, axis=axis)
  return kernel.astype(np.float32) * expanded


class NativeFp8Test(absltest.TestCase):

  def convert(self, loader, path=("decoder", "attention", "query", "kernel")):
    leaf = Leaf(path, loader.shape, np.dtype(np.float32), ("w",), loader)
    kernel, scale = native_fp8.native_fp8_leaves([leaf], FP8_OUTPUT, Leaf)
    return kernel, scale

  def test_heads_kernel_dequantizes_to_the_hf_weight(self):
    # (H*2D, E) = (4 * 96, 64) -> (E, H, 2D): 2 x 4 x 3 scales; heads below the block keep one scale each.
    tensors, stored = _tensors({"q.weight": (384, 64)})
    loader = _from(tensors["q.weight"], ops.to_heads_kernel(64, 4, 96))
    kernel, scale = self.convert(loader)
    self.assertEqual((kernel.dtype, kernel.shape, scale.path[-1], scale.shape),
                     (np.dtype(ml_dtypes.float8_e4m3fn), (64, 4, 96), "kernel_scale", (2, 4, 3)))
    values, scales = kernel.loader(), scale.loader()
    np.testing.assert_array_equal(values.view(np.uint8), stored["q.weight"].T.reshape(64, 4, 96).view(np.uint8))
    expected = quantize.fp8_dequantize(stored["q.weight"], stored["q.weight_scale_inv"], (32, 32)).T
    np.testing.assert_array_equal(_maxtext_dequantize(values, scales), expected.reshape(64, 4, 96))

  def test_slots_and_stacks(self):
    # Two tensors joined per group along the last axis (Qwen3.5's qkvz), then two layers stacked on axis 1.
    tensors, stored = _tensors({f"{n}{i}.weight": (128, 64) for n in "ab" for i in range(2)})
    layers = []
    for i in range(2):
      parts = tuple((_from(tensors[f"{n}{i}.weight"], [ops.Transpose()]), ops.Slot(-1, 2, (64, 64), k))
                    for k, n in enumerate("ab"))
      layers.append(JoinSlots(parts, (64, 256), np.dtype(np.float32)))
    kernel, scale = self.convert(Stack(tuple(layers), 1, (64, 2, 256), np.dtype(np.float32)))
    self.assertEqual(scale.shape, (2, 2, 8))
    values, scales = kernel.loader(), scale.loader()
    for i in range(2):
      a, b = (quantize.fp8_dequantize(stored[f"{n}{i}.weight"], stored[f"{n}{i}.weight_scale_inv"], (32, 32)).T
              for n in "ab")
      expected = np.concatenate([a.reshape(64, 2, 64), b.reshape(64, 2, 64)], -1).reshape(64, 256)
      np.testing.assert_array_equal(_maxtext_dequantize(values[:, i], scales[:, i]), expected)

  def test_blocks_that_do_not_line_up_are_refused(self):
    # (KV * D, E) = (2 * 48, 64) -> (E, 2, 48): one MaxText scale covers rows 0-47, HF's blocks are rows 0-31, 32-63.
    tensors, _ = _tensors({"k.weight": (96, 64)})
    with self.assertRaisesRegex(ConversionError, "do not line up.*along axis 2"):
      self.convert(_from(tensors["k.weight"], ops.to_heads_kernel(64, 2, 48)))

  def test_arithmetic_ops_are_refused(self):
    tensors, _ = _tensors({"q.weight": (64, 64)})
    with self.assertRaisesRegex(ConversionError, "ScaleInFloat32"):
      self.convert(_from(tensors["q.weight"], [ops.Transpose(), ops.ScaleInFloat32(0.125)]))

  def test_unquantized_modules_and_non_kernels_stay(self):
    self.assertFalse(native_fp8.quantized_in_maxtext(("decoder", "mlp", "gate", "kernel"), ("gate",)))
    self.assertTrue(native_fp8.quantized_in_maxtext(("decoder", "mlp", "shared_expert_gate_x", "kernel"), ("gate",)))
    self.assertFalse(native_fp8.quantized_in_maxtext(("decoder", "norm", "scale"), ()))
    self.assertTrue(native_fp8.quantized_in_maxtext(("decoder", "mlp", "routed_experts", "wi_0"), ("gate",)))

  def test_scale_shape_rule(self):
    self.assertEqual(native_fp8.scale_shape((2048, 16, 256), 128), (16, 16, 2))
    self.assertEqual(native_fp8.scale_shape((200, 64), 128), (1, 64))


if __name__ == "__main__":
  absltest.main()
