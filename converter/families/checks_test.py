"""What a family refuses, and what it converts with one precise warning, for settings MaxText cannot express.

No weights: each case is a tiny model's config.json (as transformers writes it) with one setting changed,
resolved and checked as a conversion would.
"""

from __future__ import annotations

from absl.testing import absltest, parameterized

from converter import families
from converter.errors import ConversionError
from converter.model_config import parse_model_config
from tools import tiny_models


def _resolve(model: str, target: str | None = None, **changes) -> families.ResolvedModel:
  raw = tiny_models.config_json(model)
  for key, value in changes.items():
    if isinstance(value, dict) and isinstance(raw.get(key), dict):
      raw[key] = {**raw[key], **value}
    else:
      raw[key] = value
  return families.resolve(parse_model_config(raw, "config.json"), target_model=target)


class ChecksTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("scout_rope_scaling", "llama4_16e", {"rope_parameters": {"factor": 16.0, "high_freq_factor": 1.0}},
       "hard-codes factor 8"),
      ("group_limited_greedy_routing", "deepseek2", {"topk_method": "group_limited_greedy", "n_group": 4,
                                                     "topk_group": 2}, "group-limited greedy"),
      ("sigmoid_without_renormalisation", "deepseek3", {"norm_topk_prob": False}, "always renormalises sigmoid"),
      ("non_integer_yarn_factor", "deepseek3", {"rope_parameters": {"factor": 2.5}}, "not an integer"),
      ("mscale_differs_from_mscale_all_dim", "deepseek3", {"rope_parameters": {"mscale": 0.8}},
       "scales cos/sin"),
      ("gpt_oss_swiglu_alpha", "gpt_oss", {"swiglu_alpha": 1.5}, "hard-codes 1.702"),
      ("olmo3_yarn_on_every_layer", "olmo3",
       {"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0,
                                               "original_max_position_embeddings": 8192,
                                               "attention_factor": 1.2079441541679836}}},
       "applies it to every layer"),
      ("qwen3_next_without_renormalisation", "qwen3_next", {"norm_topk_prob": False}, "always renormalises"),
  )
  def test_one_precise_warning(self, model, changes, text):
    warnings = _resolve(model, **changes).warnings()
    matching = [w for w in warnings if text in w]
    self.assertLen(matching, 1, warnings)

  def test_expressible_configs_convert_without_warnings(self):
    for model in ("deepseek2", "deepseek3", "deepseek3.2", "gpt_oss", "llama4_16e", "llama4_128e", "qwen3_next",
                  "qwen3_5", "olmo3"):
      self.assertEqual(_resolve(model).warnings(), [], model)

  @parameterized.named_parameters(
      ("deepseek_v3_on_a_deepseek2_name", "deepseek3", "deepseek2-16b", {}, "deepseek3-*"),
      ("deepseek_v2_on_a_deepseek3_name", "deepseek2", "deepseek3-671b", {}, "deepseek2-*"),
      ("deepseek_dense_layers_not_first", "deepseek3", None,
       {"mlp_layer_types": ["sparse", "dense", "sparse"]}, "mlp_layer_types"),
      ("gpt_oss_layer_types", "gpt_oss", None,
       {"layer_types": ["full_attention", "sliding_attention"] * 2}, "sliding and full attention in turn"),
      ("llama4_moe_layers_off_the_interval", "llama4_128e", None, {"moe_layers": [0, 3, 5, 7]}, "moe_layers"),
      ("llama4_nope_layers_off_the_interval", "llama4_16e", None,
       {"no_rope_layers": [1, 0, 1, 1, 1, 1, 1, 0]}, "no_rope_layers"),
      ("hybrid_full_attention_off_the_cycle", "qwen3_next", None,
       {"layer_types": ["linear_attention"] * 3 + ["full_attention", "linear_attention"] * 2 + ["full_attention"]},
       "the cycle MaxText's qwen3-next"),
      ("hybrid_partial_cycle", "qwen3_5", None,
       {"num_hidden_layers": 6, "layer_types": None, "full_attention_interval": 4}, "not a multiple of the cycle 4"),
      ("hybrid_dense_layers", "qwen3_next", None, {"mlp_only_layers": [2]}, "MoE in every layer"),
      ("hybrid_narrow_shared_expert", "qwen3_5", None, {"shared_expert_intermediate_size": 32},
       "as wide as the routed ones"),
      ("hybrid_rope_scaling", "qwen3_5", None,
       {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "plain rope"),
      ("hybrid_value_heads_not_a_multiple", "qwen3_next", None, {"linear_num_value_heads": 3},
       "not a multiple of linear_num_key_heads"),
      ("olmo3_layer_types", "olmo3", None, {"layer_types": ["sliding_attention", "full_attention"] * 4},
       "three sliding-window layers"),
  )
  def test_refused_with_the_reason(self, model, target, changes, text):
    with self.assertRaisesRegex(ConversionError, text):
      _resolve(model, target, **changes).warnings()

  def test_scanned_blocks_need_whole_cycles(self):
    model = _resolve("gpt_oss", num_hidden_layers=3, layer_types=["sliding_attention", "full_attention"] * 1 + [
        "sliding_attention"])
    with self.assertRaisesRegex(ConversionError, "not a multiple of 2.*--noscan_layers"):
      model.layout(model.config.vocab_size, True)
    self.assertLen(model.layout(model.config.vocab_size, False).groups, 3)

  def test_deepseek_targets_by_version(self):
    self.assertEqual(_resolve("deepseek2").target, "deepseek2")
    self.assertEqual(_resolve("deepseek3").target, "deepseek3")
    self.assertEqual(_resolve("deepseek3.2").target, "deepseek3.2")
    self.assertEqual(_resolve("deepseek3", model_type="kimi_k2").target, "kimi-k2")

  # --- Gemma 4 ------------------------------------------------------------------------------------------------------

  _GEMMA4_FULL_ROPE = {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}
  # transformers' hub configs: global layers' sizes as global_head_dim / num_global_key_value_heads.
  _GEMMA4_HUB_STYLE = {"per_layer_config": None, "global_head_dim": 96, "num_global_key_value_heads": 1}

  @parameterized.named_parameters(
      ("gemma4_layer_norm_epsilon", "gemma4_moe", {"rms_norm_eps": 1e-5}, "layer norms use 1e-6"),
      ("gemma4_exact_gelu", "gemma4_dense", {"hidden_activation": "gelu"}, "tanh approximation"),
      ("gemma4_bidirectional", "gemma4_e2b", {"use_bidirectional_attention": "all"}, "text decoder is causal"),
      ("gemma4_scaled_rope", "gemma4_dense",
       {"rope_parameters": {"full_attention": dict(_GEMMA4_FULL_ROPE, factor=8.0)}},
       "only unscaled default and proportional rope"),
      ("gemma4_untied_soft_cap", "gemma4_e4b", {"tie_word_embeddings": False}, "tied logits only"),
  )
  def test_gemma4_one_precise_warning(self, model, changes, text):
    warnings = _resolve(model, **changes).warnings()
    self.assertLen([w for w in warnings if text in w], 1, warnings)
    self.assertLen(warnings, 1, warnings)

  def test_gemma4_expressible_configs_convert_without_warnings(self):
    for model in ("gemma4_moe", "gemma4_dense", "gemma4_e2b", "gemma4_e4b"):
      self.assertEqual(_resolve(model).warnings(), [], model)
    # Bidirectional attention over image tokens only changes nothing for text.
    self.assertEqual(_resolve("gemma4_dense", use_bidirectional_attention="vision").warnings(), [])

  @parameterized.named_parameters(
      # transformers makes the last layer full attention; MaxText's remainder layers are all sliding.
      ("gemma4_layers_not_whole_blocks", "gemma4_moe", None,
       dict(_GEMMA4_HUB_STYLE, num_hidden_layers=8, layer_types=None), "not a multiple of 6"),
      ("gemma4_global_layer_off_the_pattern", "gemma4_dense", None,
       {"layer_types": (["sliding_attention"] * 3 + ["full_attention"]) * 3}, "MaxText's gemma4-31b hard-codes"),
      ("gemma4_e2b_pattern_on_the_e4b_name", "gemma4_e2b", "gemma4-e4b", {}, "one global layer every 6"),
      ("gemma4_global_layers_of_two_sizes", "gemma4_dense", None,
       {"per_layer_config": {"05": {"head_dim": 96}, "11": {"head_dim": 64}}}, "one size per kind"),
      ("gemma4_per_layer_intermediate_size", "gemma4_dense", None,
       {"per_layer_config": {"05": {"head_dim": 96, "intermediate_size": 64}, "11": {"head_dim": 96}}},
       "vary only head_dim and num_key_value_heads"),
      ("gemma4_attention_bias", "gemma4_moe", None, {"attention_bias": True}, "no biases"),
      ("gemma4_rope_not_per_layer_type", "gemma4_dense", None,
       {"rope_parameters": {"sliding_attention": None}}, "no 'sliding_attention' entry"),
      ("gemma4_small_with_experts", "gemma4_e4b", None,
       {"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32}, "no experts"),
      ("gemma4_small_with_keys_as_values", "gemma4_e2b", None, {"attention_k_eq_v": True}, "value projection"),
      ("gemma4_dense_target_for_small", "gemma4_e2b", "gemma4-31b", {}, "gemma4-e2b-\\*, gemma4-e4b-\\*"),
  )
  def test_gemma4_refused_with_the_reason(self, model, target, changes, text):
    with self.assertRaisesRegex(ConversionError, text):
      _resolve(model, target, **changes).warnings()

  def test_gemma4_families_and_targets_by_config(self):
    for model, family, target in (("gemma4_moe", "gemma4", "gemma4-26b"), ("gemma4_dense", "gemma4", "gemma4-31b"),
                                  ("gemma4_e2b", "gemma4_small", "gemma4-e2b"),
                                  ("gemma4_e4b", "gemma4_small", "gemma4-e4b")):
      resolved = _resolve(model)
      self.assertEqual((resolved.family.name, resolved.target), (family, target), model)
    # transformers' default is 256 per-layer inputs: a config that leaves the key out is a small model.
    raw = tiny_models.config_json("gemma4_dense")
    del raw["hidden_size_per_layer_input"]
    self.assertEqual(families.resolve(parse_model_config(raw, "config.json")).family.name, "gemma4_small")

  def test_gemma4_hub_and_transformers_config_styles_agree(self):
    for model, hub_style in (("gemma4_moe", self._GEMMA4_HUB_STYLE),
                             ("gemma4_e2b", {"per_layer_config": None, "global_head_dim": 96})):
      saved, hub = _resolve(model), _resolve(model, **hub_style)
      self.assertEqual(hub.runtime, saved.runtime, model)
      self.assertEqual(hub.layout(509, False), saved.layout(509, False), model)
    self.assertEqual(_resolve("gemma4_moe").runtime.config.global_num_kv_heads, 1)
    # Without attention_k_eq_v transformers ignores num_global_key_value_heads.
    e2b = _resolve("gemma4_e2b", per_layer_config=None, global_head_dim=96, num_global_key_value_heads=4)
    self.assertEqual((e2b.runtime.config.global_head_dim, e2b.runtime.config.global_num_kv_heads), (96, 1))

  def test_gemma4_scanned_remainder_layout(self):
    # MaxText 0.2.5's tree for 8 layers (printed from its abstract model): one block, then layers 6 and 7 stacked
    # under layers_remainder/local_layers. No transformers checkpoint has it (its last layer is full attention).
    model = _resolve("gemma4_moe", num_hidden_layers=8, layer_types=None, **self._GEMMA4_HUB_STYLE)
    groups = model.layout(509, True).groups
    self.assertEqual([(g.path, g.layers) for g in groups],
                     [(("decoder", "scanned_blocks", "local_layers"), ((0, 1, 2, 3, 4),)),
                      (("decoder", "scanned_blocks", "global_layer"), (5,)),
                      (("decoder", "layers_remainder", "local_layers"), (6, 7))])
    with self.assertRaisesRegex(ConversionError, "not a multiple of 6"):
      model.warnings()

  def test_gemma4_small_has_no_scanned_form(self):
    for model in ("gemma4_e2b", "gemma4_e4b"):
      resolved = _resolve(model)
      with self.assertRaisesRegex(ConversionError, "no scanned form.*--noscan_layers"):
        resolved.layout(509, True)
      self.assertLen(resolved.layout(509, False).groups, resolved.config.num_layers)


if __name__ == "__main__":
  absltest.main()
