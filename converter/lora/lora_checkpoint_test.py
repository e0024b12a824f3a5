"""A PEFT adapter as MaxText's LoRA tree: each factor at the path and shape MaxText's NNX LoRAParams have (layers
stacked at the kernel's scan axis, or one subtree a layer), its values qwix's factors of the adapter's, and what a
MaxText LoRA run cannot hold refused by name."""

import ml_dtypes
import numpy as np
from absl.testing import absltest

from converter.lora import lora_checkpoint, lora_export
from converter.errors import ConversionError
from converter.model_config import parse_model_config
from tools.make_tiny_checkpoint import TINY_QWEN3_CONFIG
from tools.testing.tiny_adapter import D, E, HEADS, LAYERS, M, R, write_adapter

class LoraCheckpointTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.config = parse_model_config(TINY_QWEN3_CONFIG, "config.json")

  def test_scanned_factors_stack_at_the_kernels_scan_axis(self):
    adapter = write_adapter(self.create_tempdir().full_path)
    checkpoint = lora_checkpoint.plan_lora_checkpoint(adapter, self.config, target_model=None, scan_layers=True,
                                                      save_dtype="bfloat16")
    self.assertEqual((checkpoint.modules, checkpoint.custom_metadata), (2 * LAYERS,
                                                                         {"lora": {"lora_rank": R, "lora_alpha": 8.0}}))
    query = checkpoint.tree["decoder"]["layers"]["self_attention"]["query"]
    self.assertEqual(query["kernel_lora_a"]["value"].shape, (E, LAYERS, R))
    self.assertEqual(query["kernel_lora_b"]["value"].shape, (R, LAYERS, HEADS * D))
    self.assertEqual(query["kernel_lora_a"]["value"].dtype, ml_dtypes.bfloat16)
    wo = checkpoint.tree["decoder"]["layers"]["mlp"]["wo"]
    module = next(m for m in adapter.modules if m.module == "model.layers.2.mlp.down_proj")
    a, b = lora_export.qwix_factors(lora_export.KernelSides((M,), (E,), ()), module.a.read(np.float32),
                                    module.b.read(np.float32))
    np.testing.assert_array_equal(wo["kernel_lora_a"]["value"][:, 2], a.astype(ml_dtypes.bfloat16))
    np.testing.assert_array_equal(wo["kernel_lora_b"]["value"][:, 2], b.astype(ml_dtypes.bfloat16))

  def test_unscanned_factors_sit_in_each_layers_subtree(self):
    adapter = write_adapter(self.create_tempdir().full_path)
    checkpoint = lora_checkpoint.plan_lora_checkpoint(adapter, self.config, target_model=None, scan_layers=False,
                                                      save_dtype="float32")
    self.assertEqual(sorted(checkpoint.tree["decoder"]), [f"layers_{i}" for i in range(LAYERS)])
    self.assertEqual(checkpoint.tree["decoder"]["layers_3"]["mlp"]["wo"]["kernel_lora_b"]["value"].shape, (R, E))

  def test_what_one_rank_and_alpha_cannot_hold_is_refused(self):
    for config, message in (({"use_rslora": True}, "alpha / sqrt"),
                            ({"alpha_pattern": {"q_proj": 16}}, "alpha_pattern")):
      adapter = write_adapter(self.create_tempdir().full_path, config)
      with self.subTest(message), self.assertRaisesRegex(ConversionError, message):
        lora_checkpoint.plan_lora_checkpoint(adapter, self.config, target_model=None, scan_layers=True,
                                             save_dtype="float32")


if __name__ == "__main__":
  absltest.main()
