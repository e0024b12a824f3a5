"""plan_conversion with a LoRA adapter (headers only, a sparse synthetic DeepSeek V3 FP8 checkpoint): an adapted
FP8 weight is planned as merged, and an adapter whose target the family skips (the multi-token-prediction layer)
or that asks for --keep_fp8 is refused before anything is written."""

import os
import tempfile

from absl.testing import absltest

from converter import conversion
from converter.errors import ConversionError
from converter.options import PlanOptions
from converter.sources.lora import LoraMergedSource
from tools import lora_adapters, synthetic_checkpoint


def _scratch() -> str:
  return tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))


class LoraPlanTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    config = {**synthetic_checkpoint.deepseek3_fp8_config(moe_layers=1, experts=8, vocab=256),
              "num_nextn_predict_layers": 1}
    cls.model = _scratch()
    synthetic_checkpoint.write_checkpoint(cls.model, config, list(synthetic_checkpoint.deepseek3_fp8_shapes(config)),
                                          sparse=True)

  def _adapter(self, *modules: str) -> str:
    return lora_adapters.write_random_adapter(self.model, _scratch(), modules)

  def test_fp8_weight_is_merged(self):
    adapter = self._adapter("model.layers.1.self_attn.o_proj")
    plan = conversion.plan_conversion(self.model, PlanOptions(scan_layers=False, lora_adapter_path=adapter))
    self.assertIsInstance(plan.source, LoraMergedSource)
    (leaf,) = [leaf for leaf in plan.leaves if "model.layers.1.self_attn.o_proj.weight" in leaf.sources]
    self.assertEqual(leaf.formats, ("F8_E4M3 x F32 scales, 128x128 blocks + LoRA r2",))

  def test_skipped_target_is_refused(self):
    adapter = self._adapter("model.layers.2.self_attn.o_proj")  # Layer 2 of 2: the MTP layer.
    with self.assertRaises(ConversionError) as raised:
      conversion.plan_conversion(self.model, PlanOptions(lora_adapter_path=adapter))
    for text in (os.path.join(adapter, "adapter_model.safetensors"), "'model.layers.2.self_attn.o_proj'",
                 "does not convert (skipped: the multi-token-prediction", "would be lost"):
      self.assertIn(text, str(raised.exception))

  def test_keep_fp8_is_refused(self):
    adapter = self._adapter("model.layers.1.self_attn.o_proj")
    with self.assertRaisesRegex(ConversionError, "--keep_fp8 keeps the FP8 kernels as stored"):
      conversion.plan_conversion(self.model, PlanOptions(keep_fp8=True, lora_adapter_path=adapter))


if __name__ == "__main__":
  absltest.main()
