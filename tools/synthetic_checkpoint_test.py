"""The synthetic Kimi-K2.6 INT4 checkpoint (tools/synthetic_checkpoint.py) as the converter's compressed-tensors
source reads it: hub names and dtypes, packed words of random bits, positive BF16 scales, and `weight_shape`
values written even in a sparse checkpoint (the source reads every one when it opens; a hole would read [0, 0]).

A tiny config of the same form (hub config.json, wrapper names, vision tower) keeps it fast; the full-size model
is counted, not written.
"""

import json
import math
import os
import tempfile

import ml_dtypes
import numpy as np
from absl.testing import absltest

from converter.model_config import load_model_config
from converter.sources import open_safetensors, open_source
from tools import synthetic_checkpoint as sc


def _tiny_config() -> dict:
  config = sc.kimi_k26_config(layers=3, experts=4, vocab=96)
  config["text_config"].update(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, q_lora_rank=32,
                               kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
                               num_attention_heads=4, num_key_value_heads=4)
  config["vision_config"].update(vt_hidden_size=16, vt_intermediate_size=24, vt_num_hidden_layers=2, patch_size=2,
                                 init_pos_emb_height=4, init_pos_emb_width=4, mm_hidden_size=16,
                                 text_hidden_size=64)
  return config


class KimiK26Int4Test(absltest.TestCase):

  def _write(self, sparse: bool) -> tuple[str, list]:
    directory = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    shapes = list(sc.kimi_k26_shapes(_tiny_config()))
    sc.write_checkpoint(directory, _tiny_config(), shapes, max_shard_bytes=64 << 10, sparse=sparse)
    return directory, shapes

  def test_the_config_is_the_hub_wrapper_with_int4_in_text_config(self):
    directory, _ = self._write(sparse=True)
    with open(os.path.join(directory, "config.json")) as f:
      raw = json.load(f)
    self.assertEqual(raw["architectures"], ["KimiK25ForConditionalGeneration"])
    self.assertEqual(raw["model_type"], "kimi_k25")
    self.assertEqual(raw["text_config"]["model_type"], "kimi_k2")
    quantization = raw["text_config"]["quantization_config"]
    self.assertEqual((quantization["quant_method"], quantization["format"]), ("compressed-tensors", "pack-quantized"))
    self.assertIn("re:.*mlp\\.(gate|up|gate_up|down)_proj.*", quantization["ignore"])
    self.assertNotIn("quantization_config", raw)
    self.assertEqual(raw["vision_config"]["vt_num_hidden_layers"], 2)
    self.assertEqual(load_model_config(directory).architecture, "KimiK25ForConditionalGeneration")

  def test_a_sparse_checkpoint_holds_real_weight_shapes_and_opens_as_int4(self):
    for sparse in (True, False):
      with self.subTest(sparse=sparse):
        directory, shapes = self._write(sparse)
        plain = open_safetensors(directory)
        stored = {t[0]: t for t in shapes}
        shape_names = [n for n in stored if n.endswith(".weight_shape")]
        self.assertLen(shape_names, 2 * 4 * 3)  # 2 MoE layers x 4 experts x gate, up, down.
        for name in shape_names:
          np.testing.assert_array_equal(plain.tensors[name].read(), stored[name][3])
        config = load_model_config(directory)
        source = open_source(directory, config.raw, config.path)
        expert = "language_model.model.layers.2.mlp.experts.3.down_proj.weight"
        self.assertEqual(tuple(source.tensors[expert].shape), (64, 32))
        self.assertNotIn(expert + "_packed", source.tensors)
        self.assertEqual(source.tensors["language_model.model.layers.0.mlp.down_proj.weight"].dtype,
                         np.dtype(ml_dtypes.bfloat16))
        if not sparse:
          values = source.tensors[expert].read(np.float32)
          self.assertGreater(len(np.unique(values)), 16)  # Codes of all 16 values times scales of every group.
          self.assertTrue(np.all(np.isfinite(values)))

  def test_packed_words_are_random_bits_and_scales_positive(self):
    directory, _ = self._write(sparse=False)
    plain = open_safetensors(directory)
    words = plain.tensors["language_model.model.layers.1.mlp.experts.0.gate_proj.weight_packed"].read()
    self.assertEqual(words.dtype, np.int32)
    nibbles = (words.astype("<i4").view(np.uint8)[..., None] >> np.array([0, 4], np.uint8)) & 15
    self.assertLen(np.unique(nibbles), 16)
    scales = plain.tensors["language_model.model.layers.1.mlp.experts.0.gate_proj.weight_scale"].read()
    self.assertEqual(scales.dtype, np.dtype(ml_dtypes.bfloat16))
    scales = scales.astype(np.float32)
    self.assertTrue(np.all(scales > 0))
    self.assertTrue(1e-4 < float(np.median(scales)) < 1e-2)

  def test_full_size_counts_match_the_hub(self):
    shapes = list(sc.kimi_k26_shapes(sc.kimi_k26_config()))
    # 60 MoE layers x 384 experts x 3 projections x (packed, scale, shape) = 207,360, plus 855 other text tensors
    # and the vision tower's 335: the hub's "about 208,000 tensors, 595 GB, 1.03T parameters".
    self.assertLen(shapes, 208550)
    self.assertAlmostEqual(sum(math.prod(t[1]) * np.dtype(t[2]).itemsize for t in shapes) / 1e9, 595.15, places=1)
    self.assertAlmostEqual(sc.parameter_count(shapes) / 1e12, 1.027, places=3)

  def test_the_slice_has_real_widths_and_fits_its_size(self):
    config = sc.kimi_k26_int4_for_bytes(int(22e9))
    text = config["text_config"]
    self.assertEqual((text["num_hidden_layers"], text["n_routed_experts"], text["hidden_size"]), (3, 384, 7168))


if __name__ == "__main__":
  absltest.main()
