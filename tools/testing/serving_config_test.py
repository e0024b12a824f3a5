"""tools/testing/serving_config.py: each rule passes a config vLLM reads as the original and fails one that breaks
it."""

from __future__ import annotations

import copy
import types

from absl.testing import absltest

from converter.reverse import to_huggingface
from converter.families import deepseek
from tools.testing import serving_config

# Hub-style (transformers 4) and transformers-5-style configs of the kinds the converter writes back.
LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 128, "max_position_embeddings": 131072,
    "rope_theta": 500000.0, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
GEMMA3 = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "dtype": "bfloat16", "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention"], "max_position_embeddings": 512, "num_attention_heads": 4,
    "rope_parameters": {"full_attention": {"factor": 8.0, "rope_theta": 1e6, "rope_type": "linear"},
                        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}},
}
DEEPSEEK_FP8 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "torch_dtype": "bfloat16",
    "kv_lora_rank": 32, "qk_rope_head_dim": 8, "n_routed_experts": 8, "max_position_embeddings": 163840,
    "rope_theta": 10000.0, "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                                            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
}
MULTIMODAL = {
    "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl", "dtype": "bfloat16",
    "text_config": {"model_type": "qwen3_vl_text", "dtype": "bfloat16", "num_attention_heads": 4,
                    "max_position_embeddings": 512, "vocab_size": 128,
                    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [6, 5, 5], "rope_theta": 5e6,
                                        "rope_type": "default"}},
    "vision_config": {"depth": 2},
}


def back(original: dict, dtype: str = "bfloat16") -> dict:
  """What the converter writes: the original, dtype set (torch_dtype where it was), quantization dropped."""
  config = {k: v for k, v in copy.deepcopy(original).items() if k != "quantization_config"}
  config["dtype"] = dtype
  if "torch_dtype" in config:
    config["torch_dtype"] = dtype
  if "text_config" in config:
    config["text_config"].update({k: dtype for k in ("dtype", "torch_dtype") if k in config["text_config"]})
  return config


class ServingConfigTest(absltest.TestCase):

  def assert_problem(self, written: dict, original: dict, *expected: str, dtype: str = "bfloat16", **kwargs):
    found = serving_config.problems(written, original, dtype, **kwargs)
    self.assertNotEmpty(found)
    for text in expected:
      self.assertTrue(any(text in p for p in found), (text, found))

  def test_what_the_converter_writes_passes(self):
    for original in (LLAMA, GEMMA3, DEEPSEEK_FP8, MULTIMODAL):
      for dtype in ("bfloat16", "float32"):
        self.assertEqual(serving_config.problems(back(original, dtype), original, dtype), [], original)

  def test_architectures(self):
    for value in (None, [], "LlamaForCausalLM", [3]):
      self.assert_problem({**back(LLAMA), "architectures": value}, LLAMA, "architectures:", "pooling")
    written = {k: v for k, v in back(LLAMA).items() if k != "architectures"}
    self.assert_problem(written, LLAMA, "architectures: None")
    self.assert_problem({**back(LLAMA), "architectures": ["LlamaModel"]}, LLAMA, "the original's is")

  def test_model_type(self):
    self.assert_problem({**back(LLAMA), "model_type": None}, LLAMA, "model_type: None")
    self.assert_problem({**back(LLAMA), "model_type": "mistral"}, LLAMA, "model_type: 'mistral'")
    kimi = {**DEEPSEEK_FP8, "model_type": "kimi_k2"}
    self.assertEqual(serving_config.problems(back(DEEPSEEK_FP8), kimi, "bfloat16"), [])  # Read the same.

  def test_dtype_must_be_the_weights(self):
    self.assert_problem(back(LLAMA), LLAMA, "dtype: 'bfloat16' but the weights are float32", dtype="float32")
    self.assert_problem({**back(LLAMA), "torch_dtype": "float32"}, LLAMA, "torch_dtype: 'float32' against dtype")
    self.assert_problem({**back(LLAMA), "dtype": "bf16", "torch_dtype": "bf16"}, LLAMA, "not a torch dtype name")
    text = back(MULTIMODAL)
    text["text_config"]["dtype"] = "float32"
    self.assert_problem(text, MULTIMODAL, "text_config.dtype: 'float32' but the weights are bfloat16")

  def test_dtype_must_be_there(self):
    written = {k: v for k, v in back(LLAMA).items() if k not in ("dtype", "torch_dtype")}
    self.assert_problem(written, LLAMA, "neither `dtype` nor `torch_dtype`", "the original carries it")
    # A text_config's dtype is where vLLM looks next.
    only_text = {k: v for k, v in back(MULTIMODAL).items() if k != "dtype"}
    self.assertEqual(serving_config.problems(only_text, MULTIMODAL, "bfloat16"), [])

  def test_torch_dtype_the_original_had_is_kept(self):
    written = {k: v for k, v in back(LLAMA).items() if k != "torch_dtype"}
    self.assert_problem(written, LLAMA, "torch_dtype: the original carries it")
    # A transformers 5 original (dtype only) needs none.
    self.assertNotIn("torch_dtype", back(GEMMA3))
    self.assertEqual(serving_config.problems(back(GEMMA3), GEMMA3, "bfloat16"), [])

  def test_mixed_weights_name_the_dtype_they_promote_to(self):
    self.assertEqual(serving_config.weights_dtype(["BF16", "F32", "I64"]), "float32")
    self.assertEqual(serving_config.weights_dtype(["bfloat16", "bfloat16"]), "bfloat16")
    self.assertEqual(serving_config.weights_dtype(["F16", "BF16"]), "float32")
    self.assertIsNone(serving_config.weights_dtype(["I64", "U8"]))
    mixed = serving_config.weights_dtype(["BF16", "F32"])
    self.assertEqual(serving_config.problems(back(DEEPSEEK_FP8, "float32"), DEEPSEEK_FP8, mixed), [])
    self.assert_problem(back(DEEPSEEK_FP8, "bfloat16"), DEEPSEEK_FP8, "but the weights are float32", dtype=mixed)

  def test_float16_gemma3(self):
    self.assert_problem(back(GEMMA3, "float16"), GEMMA3, "float16 for model_type 'gemma3_text'", dtype="float16")
    self.assertEqual(serving_config.problems(back(LLAMA, "float16"), LLAMA, "float16"), [])

  def test_quantization_config_on_dequantized_weights(self):
    kept = {**back(DEEPSEEK_FP8), "quantization_config": DEEPSEEK_FP8["quantization_config"]}
    self.assert_problem(kept, DEEPSEEK_FP8, "quantization_config: kept while the weights are written unquantized")
    self.assertEqual(serving_config.problems(kept, DEEPSEEK_FP8, "bfloat16", weights_quantized=True), [])
    self.assert_problem({**back(LLAMA), "compression_config": {"quant_method": "compressed-tensors"}}, LLAMA,
                        "compression_config: kept")
    in_text = back(MULTIMODAL)
    in_text["text_config"]["quantization_config"] = {"quant_method": "fp8"}
    self.assert_problem(in_text, MULTIMODAL, "text_config.quantization_config: kept")
    self.assert_problem(back(LLAMA), LLAMA, "hf_quant_config.json: next to config.json",
                        files=["tokenizer.json", "hf_quant_config.json"])

  def test_rope_type_conflicts_with_legacy_type(self):
    written = back(DEEPSEEK_FP8)
    written["rope_scaling"] = {**written["rope_scaling"], "rope_type": "linear"}
    original = {**DEEPSEEK_FP8, "rope_scaling": written["rope_scaling"]}
    self.assert_problem(written, original, "rope_scaling: rope_type 'linear' conflicts with the legacy type 'yarn'")
    mrope = back(LLAMA)
    mrope["rope_scaling"] = {"type": "mrope"}
    self.assert_problem(mrope, {**LLAMA, "rope_scaling": mrope["rope_scaling"]}, "'mrope' without mrope_section")

  def test_yarn_needs_its_original_length(self):
    written = back(DEEPSEEK_FP8)
    written["rope_scaling"] = {k: v for k, v in written["rope_scaling"].items()
                               if k != "original_max_position_embeddings"}
    self.assert_problem(written, {**DEEPSEEK_FP8, "rope_scaling": written["rope_scaling"]},
                        "rope_scaling: yarn RoPE without original_max_position_embeddings")
    nested = back(GEMMA3)
    nested["rope_parameters"]["full_attention"]["rope_type"] = "yarn"
    self.assert_problem(nested, GEMMA3, "rope_parameters.full_attention: yarn RoPE without")

  def test_rope_scaling_next_to_different_rope_parameters(self):
    written = {**back(LLAMA), "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
    self.assert_problem(written, LLAMA, "rope_scaling: differs from rope_parameters")

  def test_fields_vllm_reads_are_kept(self):
    for original, key, level in ((LLAMA, "rope_theta", ""), (LLAMA, "max_position_embeddings", ""),
                                 (GEMMA3, "sliding_window", ""), (GEMMA3, "layer_types", ""),
                                 (GEMMA3, "rope_parameters", ""), (DEEPSEEK_FP8, "rope_scaling", ""),
                                 (DEEPSEEK_FP8, "kv_lora_rank", ""), (DEEPSEEK_FP8, "n_routed_experts", ""),
                                 (MULTIMODAL, "rope_parameters", "text_config"),
                                 (MULTIMODAL, "max_position_embeddings", "text_config")):
      written = back(original)
      target = written[level] if level else written
      del target[key]
      self.assert_problem(written, original, f"{level + '.' if level else ''}{key}: missing")
    changed = back(GEMMA3)
    changed["rope_parameters"]["sliding_attention"]["rope_theta"] = 1e6
    self.assert_problem(changed, GEMMA3, "rope_parameters: {")

  def test_text_config_is_kept(self):
    written = {k: v for k, v in back(MULTIMODAL).items() if k != "text_config"}
    self.assert_problem(written, MULTIMODAL, "text_config: the original has one")
    heads = back(MULTIMODAL)
    del heads["text_config"]["num_attention_heads"]
    self.assert_problem(heads, MULTIMODAL, "text_config.num_attention_heads: missing")

  def test_vocab_size_when_the_conversion_changed_it(self):
    resized = back(LLAMA)
    resized["vocab_size"] = 96
    self.assertEqual(serving_config.problems(resized, LLAMA, "bfloat16", vocab_size=96), [])
    self.assert_problem(resized, LLAMA, "vocab_size: 96, the original's is 128")
    self.assert_problem(back(LLAMA), LLAMA, "vocab_size: 128 but the embedding has 96 rows", vocab_size=96)
    self.assert_problem(back(MULTIMODAL), MULTIMODAL, "text_config.vocab_size: 128 but", vocab_size=96)


class WrittenConfigTest(absltest.TestCase):
  """converter/reverse/to_huggingface.written_config on hub (transformers 4) and transformers 5 configs: what vLLM reads
  as the original, in the original's schema."""

  def written(self, original: dict, dtype: str = "bfloat16", family=None) -> dict:
    plan = types.SimpleNamespace(hf_config=copy.deepcopy(original), dtype=types.SimpleNamespace(name=dtype),
                                 family=family or types.SimpleNamespace(config_back=lambda config: config))
    return to_huggingface.written_config(plan)

  def test_every_kind_passes_in_its_own_schema(self):
    for original in (LLAMA, GEMMA3, DEEPSEEK_FP8, MULTIMODAL):
      for dtype in ("bfloat16", "float32"):
        written = self.written(original, dtype)
        self.assertEqual(serving_config.problems(written, original, dtype), [], original)
        self.assertEqual(written["dtype"], dtype)
        self.assertEqual("torch_dtype" in written, "torch_dtype" in original)  # transformers 5 writes none.

  def test_quantization_is_dropped_wherever_it_is(self):
    written = self.written({**LLAMA, "compression_config": {"quant_method": "compressed-tensors"}})
    self.assertNotIn("compression_config", written)
    self.assertNotIn("quantization_config", self.written(DEEPSEEK_FP8))
    text = copy.deepcopy(MULTIMODAL)
    text["text_config"]["quantization_config"] = {"quant_method": "compressed-tensors"}
    self.assertEqual(serving_config.problems(self.written(text), text, "bfloat16"), [])

  def test_kimi_k2_is_written_as_what_vllm_reads_the_same(self):
    kimi = {**DEEPSEEK_FP8, "model_type": "kimi_k2", "auto_map": {"AutoConfig": "configuration_deepseek.X"}}
    written = self.written(kimi, family=deepseek.FAMILY)
    self.assertEqual(written["model_type"], "deepseek_v3")
    self.assertEqual(serving_config.problems(written, kimi, "bfloat16"), [])


if __name__ == "__main__":
  absltest.main()
