"""config.json parsing: dimensions read or derived as transformers does, nested text configs, the rope base under
every spelling, and errors that name the file and the key instead of failing later in a family."""

import json
import os
import tempfile

from absl.testing import absltest, parameterized

from converter.errors import ConversionError
from converter.model_config import check_claimed_counts, load_model_config, parse_model_config
from tools.make_tiny_checkpoint import TINY_QWEN3_CONFIG

_PATH = "/models/m/config.json"
_MINIMAL = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
            "num_hidden_layers": 2, "vocab_size": 100}


def _with(**changes) -> dict:
  """_MINIMAL with `changes`; a value of None removes the key."""
  raw = dict(_MINIMAL, **changes)
  return {k: v for k, v in raw.items() if v is not None}


class ParseModelConfigTest(parameterized.TestCase):

  def test_tiny_qwen3_is_read_as_written(self):
    config = parse_model_config(TINY_QWEN3_CONFIG, _PATH)
    self.assertEqual(
        (config.architecture, config.model_type, config.hidden_size, config.num_layers, config.num_heads,
         config.num_kv_heads, config.head_dim, config.intermediate_size, config.vocab_size, config.rms_norm_eps,
         config.rope_theta, config.tie_word_embeddings),
        ("Qwen3ForCausalLM", "qwen3", 64, 4, 4, 2, 24, 128, 257, 1e-6, 1e6, False))
    self.assertEqual(config.path, _PATH)
    self.assertEqual(config.get("max_position_embeddings"), 512)  # Every other key stays reachable.

  def test_defaults_for_optional_keys(self):
    config = parse_model_config(_MINIMAL, _PATH)
    # head_dim = hidden / heads, one KV head per query head, as transformers derives them.
    self.assertEqual((config.head_dim, config.num_kv_heads), (16, 4))
    self.assertEqual((config.intermediate_size, config.rms_norm_eps, config.rope_theta, config.tie_word_embeddings,
                      config.model_type), (1, 1e-6, 10000.0, False, ""))

  def test_an_explicit_head_dim_wins_over_the_derived_one(self):
    self.assertEqual(parse_model_config(_with(head_dim=40), _PATH).head_dim, 40)

  def test_latent_attention_sizes_its_heads_whatever_hidden_over_heads_is(self):
    """Kimi K2-shaped: hidden 224 over 6 heads is not whole; MLA's query/key head is nope + rope."""
    raw = _with(hidden_size=224, num_attention_heads=6, kv_lora_rank=48, qk_nope_head_dim=24, qk_rope_head_dim=16)
    self.assertEqual(parse_model_config(raw, _PATH).head_dim, 40)
    with self.assertRaisesRegex(ConversionError, "hidden_size 224 is not divisible by 6 heads"):
      parse_model_config(_with(hidden_size=224, num_attention_heads=6, kv_lora_rank=48, qk_nope_head_dim=24), _PATH)

  @parameterized.named_parameters(
      ("top_level", {"rope_theta": 5e5}, 5e5),
      ("rope_parameters", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, 1e6),
      ("per_attention_type", {"rope_parameters": {"full_attention": {"rope_theta": 1e6},
                                                  "sliding_attention": {"rope_theta": 1e4}}}, 1e6),
      ("top_level_first", {"rope_theta": 2e5, "rope_parameters": {"rope_theta": 1e6}}, 2e5),
      ("null_top_level", {"rope_theta": None, "rope_parameters": {"rope_theta": 3e5}}, 3e5),
      ("absent", {}, 10000.0),
  )
  def test_rope_theta(self, keys, theta):
    raw = dict(_MINIMAL, **keys)
    self.assertEqual(parse_model_config(raw, _PATH).rope_theta, theta)

  def test_a_nested_text_config_is_merged_over_the_outer_one(self):
    # A multimodal wrapper (Gemma 3, Qwen3.5): the decoder's dimensions live in text_config.
    raw = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "tie_word_embeddings": True,
           "vision_config": {"hidden_size": 1152},
           "text_config": {"model_type": "gemma3_text", "hidden_size": 256, "num_attention_heads": 4,
                           "num_key_value_heads": 1, "head_dim": 48, "num_hidden_layers": 3, "vocab_size": 509}}
    config = parse_model_config(raw, _PATH)
    self.assertEqual((config.architecture, config.model_type, config.hidden_size, config.num_kv_heads,
                      config.tie_word_embeddings), ("Gemma3ForConditionalGeneration", "gemma3_text", 256, 1, True))
    self.assertEqual(config.get("vision_config"), {"hidden_size": 1152})

  @parameterized.named_parameters(
      ("not_an_object", ["LlamaForCausalLM"], "not a JSON object"),
      ("no_architectures", _with(architectures=None), "missing 'architectures'"),
      ("empty_architectures", _with(architectures=[]), "missing 'architectures'"),
      ("missing_hidden_size", _with(hidden_size=None), "missing required key 'hidden_size'"),
      ("missing_layers", _with(num_hidden_layers=None), "missing required key 'num_hidden_layers'"),
      ("zero_vocab", _with(vocab_size=0), "'vocab_size' must be a positive integer, got 0"),
      ("bool_is_not_an_int", _with(num_hidden_layers=True), "'num_hidden_layers' must be a positive integer"),
      ("float_heads", _with(num_attention_heads=4.0), "'num_attention_heads' must be a positive integer"),
      ("negative_head_dim", _with(head_dim=-8), "'head_dim' must be a positive integer, got -8"),
      ("indivisible_hidden", _with(hidden_size=66), "no 'head_dim' and hidden_size 66 is not divisible by 4"),
      ("kv_heads_not_dividing", _with(num_key_value_heads=3), "num_attention_heads 4 is not a multiple of"
                                                              " num_key_value_heads 3"),
      ("null_eps", dict(_MINIMAL, rms_norm_eps=None), "'rms_norm_eps' must be a number, got None"),
      ("string_theta", _with(rope_theta="1e6"), "'rope_theta' must be a number, got '1e6'"),
      ("null_nested_theta", _with(rope_parameters={"rope_theta": None}),
       "'rope_parameters.rope_theta' must be a number, got None"),
  )
  def test_errors_name_the_file_and_the_problem(self, raw, message):
    with self.assertRaises(ConversionError) as raised:
      parse_model_config(raw, _PATH)
    self.assertStartsWith(str(raised.exception), f"{_PATH}: ")
    self.assertIn(message, str(raised.exception))

  def test_require_names_the_key_and_the_architecture(self):
    config = parse_model_config(_with(q_lora_rank=None, kv_lora_rank=512, sliding_window=None), _PATH)
    self.assertEqual(config.require("kv_lora_rank"), 512)
    self.assertIsNone(config.get("q_lora_rank"))
    self.assertEqual(config.get("q_lora_rank", 7), 7)
    with self.assertRaisesRegex(ConversionError, f"{_PATH}: missing required key 'q_lora_rank' for LlamaForCausalLM"):
      config.require("q_lora_rank")
    config_with_null = parse_model_config(dict(_MINIMAL, sliding_window=None), _PATH)
    with self.assertRaisesRegex(ConversionError, "missing required key 'sliding_window'"):
      config_with_null.require("sliding_window")  # Present but null is as good as missing.


class ClaimedCountsTest(absltest.TestCase):
  """Counts config.json claims are refused beyond what the checkpoint's tensors can hold, before any layout."""

  SHAPES = [(512, 256), (256,), (0, 4096)] + [(64,)] * 20  # 23 tensors, the longest non-empty axis 512.

  def test_counts_within_what_the_tensors_hold_pass(self):
    config = parse_model_config(dict(TINY_QWEN3_CONFIG, num_hidden_layers=512, max_window_layers=28,
                                     vision_config={"depth": 23}), _PATH)
    check_claimed_counts(config, self.SHAPES, "/ckpt")

  def test_each_count_beyond_them_is_refused_by_its_key(self):
    for changes, key in [({"num_hidden_layers": 10**7}, "num_hidden_layers is 10,000,000"),
                         ({"num_hidden_layers": 513}, "num_hidden_layers is 513"),  # The empty tensor's 4096 counts not.
                         ({"num_experts": 2**31}, "num_experts is 2,147,483,648"),
                         ({"n_routed_experts": 1000}, "n_routed_experts is 1,000"),
                         ({"first_k_dense_replace": 10**6}, "first_k_dense_replace is 1,000,000"),
                         ({"vision_config": {"depth": 10**9}}, "vision_config.depth is 1,000,000,000")]:
      with self.subTest(key=key):
        config = parse_model_config(dict(TINY_QWEN3_CONFIG, **changes), _PATH)
        with self.assertRaisesRegex(ConversionError, f"^{_PATH}: {key}, more than /ckpt can hold \\(23 tensors, the"
                                    " longest axis 512"):
          check_claimed_counts(config, self.SHAPES, "/ckpt")


class LoadModelConfigTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.model_dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    self.path = os.path.join(self.model_dir, "config.json")

  def test_reads_config_json_of_the_directory(self):
    with open(self.path, "w") as f:
      json.dump(TINY_QWEN3_CONFIG, f)
    config = load_model_config(self.model_dir)
    self.assertEqual((config.path, config.head_dim, config.num_kv_heads), (self.path, 24, 2))

  def test_a_missing_config_is_named(self):
    with self.assertRaisesRegex(ConversionError, f"{self.path}: missing"):
      load_model_config(self.model_dir)

  def test_malformed_json_is_named(self):
    with open(self.path, "w") as f:
      f.write('{"hidden_size": 64,')
    with self.assertRaisesRegex(ConversionError, f"{self.path}: malformed config.json \\(not valid JSON: JSONDecodeError"):
      load_model_config(self.model_dir)


if __name__ == "__main__":
  absltest.main()
