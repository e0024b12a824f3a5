"""A MaxText LoRA checkpoint written back as a PEFT adapter: a PEFT adapter made a MaxText LoRA checkpoint
(lora_checkpoint.py) comes back with the same factors, under PEFT's names, with a config PEFT loads as it is."""

import json
import os

import numpy as np
from absl.testing import absltest

from converter.lora import lora_checkpoint
from converter.model_config import load_model_config
from converter.options import ReverseOptions
from converter.reverse import lora_adapter
from converter.sources.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from tools.checkpoint_io import read_safetensors_dir
from tools.testing.tiny_adapter import ALPHA, R, write_adapter

TINY = "testdata/tiny-qwen3"


class LoraAdapterTest(absltest.TestCase):

  def test_a_peft_adapter_made_a_maxtext_checkpoint_comes_back_whole(self):
    adapter = write_adapter(self.create_tempdir().full_path)
    for scan_layers in (True, False):
      checkpoint = lora_checkpoint.plan_lora_checkpoint(adapter, load_model_config(TINY), target_model=None,
                                                        scan_layers=scan_layers, save_dtype="float32")
      items = lora_checkpoint.write_lora_checkpoint(checkpoint, os.path.join(self.create_tempdir().full_path, "l"))
      out = os.path.join(self.create_tempdir().full_path, "adapter")
      export = lora_adapter.export_lora_adapter(items, out, ReverseOptions(hf_config_path=TINY))
      self.assertEqual((export.rank, export.alpha, len(export.modules)), (R, ALPHA, len(adapter.modules)))
      self.assertEqual(sorted(os.listdir(out)), [ADAPTER_CONFIG, ADAPTER_WEIGHTS])
      with open(os.path.join(out, ADAPTER_CONFIG)) as f:
        config = json.load(f)
      self.assertEqual((config["peft_type"], config["r"], config["lora_alpha"], config["use_rslora"]),
                       ("LORA", R, ALPHA, False))
      self.assertEqual(config["target_modules"], ["down_proj", "q_proj"])
      written = read_safetensors_dir(out)
      for module in adapter.modules:
        prefix = f"base_model.model.{module.module}"
        np.testing.assert_allclose(written[f"{prefix}.lora_A.weight"], module.a.read(np.float32), rtol=1e-6)
        np.testing.assert_allclose(written[f"{prefix}.lora_B.weight"], module.b.read(np.float32), rtol=1e-6)
      self.assertLen(written, 2 * len(adapter.modules))


if __name__ == "__main__":
  absltest.main()
