"""MaxText's qwix LoRA factors <-> PEFT's, derived from the family's ops: the kernel-space product of the qwix
factors is the family's ops applied to the HF-space product (RoPE interleave and query scale included), both
directions invert each other, and what cannot carry a LoRA adapter is refused."""

import numpy as np
from absl.testing import absltest, parameterized

from converter import ops
from converter.lora import lora_export
from converter.families import Param

E, H, D, M, R = 24, 3, 8, 40, 4


def _params() -> dict[str, Param]:
  rope_and_scale = (ops.InterleaveRope(), ops.ScaleInFloat32(D ** -0.5))
  return {
      "query": Param("self_attention/query/kernel", "q.weight", (H * D, E),
                     ops.to_heads_kernel(E, H, D) + rope_and_scale),
      "out": Param("self_attention/out/kernel", "o.weight", (E, H * D), ops.to_out_kernel(E, H, D)),
      "mlp": Param("mlp/wi_0/kernel", "gate.weight", (M, E), (ops.Transpose(),)),
  }


def _apply(op_list, value):
  for op in op_list:
    value = op(value)
  return value


class FactorsTest(parameterized.TestCase):

  @parameterized.parameters("query", "out", "mlp")
  def test_qwix_product_is_the_kernel_of_the_hf_product(self, name):
    param = _params()[name]
    sides = lora_export.kernel_sides(param)
    rng = np.random.default_rng(0)
    out_dim, in_dim = param.hf_shape
    a = rng.standard_normal((R, in_dim)).astype(np.float32)
    b = rng.standard_normal((out_dim, R)).astype(np.float32)
    lora_a, lora_b = lora_export.qwix_factors(sides, a, b)
    self.assertEqual((lora_a.shape, lora_b.shape), ((in_dim, R), (R, out_dim)))  # Measured on MaxText 0.2.5.
    kernel = ops.output_shape(param.ops, param.hf_shape)
    np.testing.assert_allclose((lora_a @ lora_b).reshape(kernel), _apply(param.ops, b @ a), rtol=1e-5, atol=1e-5)
    back_a, back_b = lora_export.peft_factors(sides, lora_a, lora_b)
    np.testing.assert_array_equal(back_a, a)
    np.testing.assert_allclose(back_b, b, rtol=2 ** -22, atol=0)  # The query scale is undone within one ulp.

  def test_a_wrong_output_order_is_seen(self):
    """Without the RoPE interleave undone, the query's B comes back permuted."""
    sides = lora_export.kernel_sides(_params()["query"])
    a, b = np.ones((R, E), np.float32), np.arange(H * D * R, dtype=np.float32).reshape(H * D, R)
    lora_a, lora_b = lora_export.qwix_factors(sides, a, b)
    wrong = lora_export.KernelSides(sides.in_shape, sides.out_shape, sides.out_ops[1:])
    self.assertFalse(np.allclose(lora_export.peft_factors(wrong, lora_a, lora_b)[1], b))

  @parameterized.named_parameters(
      ("experts", Param("mlp/wi_0", "e.{expert}.w", (M, E), (ops.Transpose(),), experts=4), "experts"),
      ("not_transposed", Param("token_embedder/embedding", "embed.weight", (M, E)), "not the transposed"),
      ("fused", Param("mlp/wi_0/kernel", "gate_up.weight", (2 * M, E), (ops.halves(0, 2, 2 * M, 0),
                                                                        ops.Transpose())), "not the transposed"),
      ("permuted", Param("x/kernel", "x.weight", (M, E), (ops.Transpose(), ops.Permute((1, 0)))), "layout op"),
  )
  def test_refused(self, param, reason):
    with self.assertRaisesRegex(ValueError, reason):
      lora_export.kernel_sides(param)


class LeafKeyTest(parameterized.TestCase):

  @parameterized.parameters(
      (("params", "params", "decoder", "layers", "mlp", "wo", "kernel_lora_a"),
       ("decoder", "layers", "mlp", "wo", "kernel_lora_a")),
      (("decoder", "layers", "0", "self_attention", "query", "kernel_lora_b", "value"),
       ("decoder", "layers_0", "self_attention", "query", "kernel_lora_b")),
      (("base", "decoder", "layers_3", "mlp", "wi_0", "kernel_lora_a", "value"),
       ("decoder", "layers_3", "mlp", "wi_0", "kernel_lora_a")),
      (("opt_state", "0", "mu", "decoder", "layers", "mlp", "wo", "kernel_lora_a"), None),
      (("params", "params", "decoder", "layers", "mlp", "wo", "kernel"), None),
  )
  def test_layouts(self, stored, expected):
    self.assertEqual(lora_export.lora_leaf_key(stored), expected)


if __name__ == "__main__":
  absltest.main()
