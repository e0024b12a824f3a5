"""What a family refuses, and what it converts with one precise warning, for settings MaxText cannot express.

No weights: each case is a tiny model's config.json (as transformers writes it) with one setting changed,
resolved and checked as a conversion would.
"""

from __future__ import annotations

import re

from absl.testing import absltest, parameterized

from converter import families
from converter.planning import plan
from converter.errors import ConversionError
from converter.model_config import parse_model_config
from converter.options import PlanOptions
from tools.make_tiny_checkpoint import TINY_QWEN3_CONFIG
from tools.testing import tiny_models


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
    self.assertEqual(_resolve("deepseek3", model_type="kimi_k2").target, "kimi-k2-1t")

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

  # --- Gemma 4 and Llama 4 vision towers ---------------------------------------------------------------------------

  @parameterized.named_parameters(
      ("gemma4_clipped_linears", "gemma4_mm", {"vision_config": {"use_clipped_linears": True}}, "no clip bounds"),
      ("gemma4_no_standardization", "gemma4_mm", {"vision_config": {"standardize": False}},
       "always standardizes its soft tokens"),
      ("gemma4_vision_eps_differs_from_text_eps", "gemma4_mm", {"vision_config": {"rms_norm_eps": 1e-5}},
       "rms_norm_eps=1e-05 differs from the text rms_norm_eps=1e-06"),
      ("gemma4_grouped_vision_heads", "gemma4_mm", {"vision_config": {"num_key_value_heads": 2}},
       "as many key/value heads as query heads"),
      ("gemma4_vision_head_dim", "gemma4_mm", {"vision_config": {"head_dim": 32}}, "hidden_size / num_attention_heads"),
      ("gemma4_position_table_too_short", "gemma4_mm", {"vision_config": {"position_embedding_size": 59}},
       "smaller than the 60 patches a side"),
      ("gemma4_patches_not_whole_pooling_cells", "gemma4_mm", {"vision_config": {"patch_size": 14}},
       "whole 42-pixel pooling cells"),
      ("gemma4_exact_gelu_tower", "gemma4_mm", {"vision_config": {"hidden_activation": "gelu"}}, "tanh GELU"),
      ("gemma4_vision_rope_type", "gemma4_mm",
       {"vision_config": {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 250.0}}},
       "only the axial 2-D"),
      ("gemma4_image_token_moved", "gemma4_mm", {"image_token_id": 262144}, "hard-codes 258880"),
      ("llama4_shuffle_mlp_width", "llama4_mm", {"vision_config": {"intermediate_size": 128}},
       "reads hidden_size / pixel_shuffle_ratio\\^2 = 256"),
      ("llama4_adapter_not_square", "llama4_mm", {"vision_config": {"projector_input_dim": 64}},
       "projector_input_dim=64 != projector_output_dim=96"),
      ("llama4_projector_input", "llama4_mm", {"vision_config": {"vision_output_dim": 128}},
       "vision_output_dim=128 != projector_output_dim=96"),
      ("llama4_text_eps_not_the_vision_layer_norms", "llama4_mm", {"text_config": {"rms_norm_eps": 1e-6}},
       "vision LayerNorms use 1e-05"),
      ("llama4_rectangular_tiles", "llama4_mm", {"vision_config": {"image_size": [32, 48]}}, "square tiles"),
      ("llama4_tile_not_whole_patches", "llama4_mm", {"vision_config": {"image_size": 30}},
       "not a multiple of patch_size=4"),
      ("llama4_image_token_moved", "llama4_mm", {"image_token_index": 200090}, "hard-codes 200092"),
      ("llama4_vision_rope_scaled", "llama4_mm",
       {"vision_config": {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}}},
       "only the unscaled 2-D rope"),
  )
  def test_vision_tower_refused_with_the_reason(self, model, changes, text):
    with self.assertRaisesRegex(ConversionError, f"vision tower cannot run in MaxText.*{text}"):
      _resolve(model, **changes).warnings()

  def test_gemma4_and_llama4_towers_convert_without_warnings(self):
    for model, leaves in (("gemma4_mm", 31), ("llama4_mm", 42)):
      resolved = _resolve(model)
      self.assertEqual(resolved.warnings(), [], model)
      self.assertLen(resolved.towers.params, leaves, model)
    overrides = _resolve("gemma4_mm").runtime.config.overrides()
    self.assertEqual([overrides[k] for k in ("use_multimodal", "image_size_for_vit", "vision_output_length")],
                     [True, [672, 960], 280])

  def test_gemma4_and_llama4_hub_vision_configs_agree(self):
    # Hub configs: Gemma 4's vision rope type "default" (transformers reads it as "axial"), Llama 4's rope_theta
    # outside rope_parameters (transformers 4's style).
    for model, hub_style in (("gemma4_mm", {"rope_parameters": {"rope_theta": 250.0, "rope_type": "default"}}),
                             ("llama4_mm", {"rope_parameters": None, "rope_theta": 5000.0})):
      saved, hub = _resolve(model), _resolve(model, vision_config=hub_style)
      self.assertEqual(hub.warnings(), [], model)
      self.assertEqual(hub.runtime, saved.runtime, model)
      self.assertNotIn(saved.runtime.config.overrides()["rope_theta_for_vit"], (100.0, 10000.0), model)

  @parameterized.named_parameters(
      # A patch of 8 still tiles 672x960 (84 x 120 patches); MaxText's processor counts tokens with 16 and 3.
      ("gemma4_off_maxtext_preprocessing",
       {"vision_config": {"patch_size": 8, "position_embedding_size": 128}, "text_config": {"sliding_window": 1200}},
       "vision_output_length=1120 per image"),
      ("gemma4_causal_image_block", {"text_config": {"use_bidirectional_attention": None}},
       "use_bidirectional_attention=None"),
      ("gemma4_window_within_the_image", {"text_config": {"sliding_window": 280}},
       "sliding_window=280 does not exceed the 280 soft tokens"),
  )
  def test_gemma4_tower_one_precise_warning(self, changes, text):
    warnings = _resolve("gemma4_mm", **changes).warnings()
    self.assertLen(warnings, 1, warnings)
    self.assertIn(text, warnings[0])

  def test_gemma4_audio_tower_is_skipped_and_the_vision_tower_only_with_text_only(self):
    audio, vision = "model.audio_tower.layers.0.feed_forward1.ffw_layer_1.linear.weight", "model.vision_tower.std_bias"
    for text_only, skipped in ((False, {audio}), (True, {audio, vision})):
      model = families.resolve(parse_model_config(tiny_models.config_json("gemma4_mm"), "config.json"),
                               text_only=text_only)
      self.assertEqual(model.multimodal, not text_only)
      ignored = model.ignored_tensors()
      self.assertEqual({n for n in (audio, vision) if any(re.match(p, n) and r for p, r in ignored.items())},
                       skipped)
    self.assertIn("no Gemma 4 audio encoder", next(r for p, r in ignored.items() if re.match(p, audio)))

  def test_gemma4_small_multimodal_converts_its_text_alone(self):
    raw = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
           "text_config": tiny_models.config_json("gemma4_e2b"),
           "vision_config": tiny_models.config_json("gemma4_mm")["vision_config"]}
    model = families.resolve(parse_model_config(raw, "config.json"))
    self.assertEqual((model.family.name, model.target, model.multimodal), ("gemma4_small", "gemma4-e2b", False))
    self.assertLen([w for w in model.warnings() if "gemma4-e2b has no multimodal form in MaxText 0.2.5" in w], 1)
    ignored = model.ignored_tensors()
    for name in ("model.vision_tower.std_bias", "model.embed_vision.embedding_projection.weight",
                 "model.audio_tower.layers.0.feed_forward1.ffw_layer_1.linear.weight"):
      self.assertTrue(any(re.match(p, name) and r for p, r in ignored.items()), name)
    self.assertFalse(any(re.match(p, "model.language_model.layers.0.mlp.up_proj.weight") for p in ignored))
    self.assertNotIn("use_multimodal", {k for k, v in model.runtime.config.overrides().items() if v})

  def test_llama4_tower_only_with_its_wrapper(self):
    self.assertFalse(_resolve("llama4_16e").multimodal)
    text = families.resolve(parse_model_config(tiny_models.config_json("llama4_mm"), "config.json"), text_only=True)
    self.assertNotIn("hidden_size_for_vit", text.runtime.config.overrides())
    for name in ("vision_model.class_embedding", "multi_modal_projector.linear_1.weight"):
      self.assertIn("(--text_only)", next(r for p, r in text.ignored_tensors().items() if re.match(p, name)), name)

  @parameterized.named_parameters(
      ("vision_eps_differs_from_text_eps", "qwen3_vl", None, {"text_config": {"rms_norm_eps": 1e-5}},
       "tower's LayerNorm eps 1e-06"),
      ("merger_output_not_the_text_width", "qwen3_vl", None, {"vision_config": {"out_hidden_size": 32}},
       "out_hidden_size=32 differs from the text hidden_size=64"),
      ("deepstack_index_past_the_tower", "qwen3_vl_moe", None, {"vision_config": {"deepstack_visual_indexes": [0, 3]}},
       r"deepstack_visual_indexes=\[0, 3\]: each must be a distinct block index below depth=3"),
      ("erf_gelu_vision_blocks", "qwen3_5_mm", None, {"vision_config": {"hidden_act": "gelu"}}, "tanh GELU"),
      ("position_table_not_square", "qwen3_vl", None, {"vision_config": {"num_position_embeddings": 12}},
       "not a square"),
      ("image_token_moved", "qwen3_vl", None, {"image_token_id": 151654}, "hard-codes 151655"),
      ("qwen3_5_image_token_moved", "qwen3_5_mm", None, {"vision_start_token_id": 151652}, "hard-codes 248053"),
      ("moe_checkpoint_on_a_dense_name", "qwen3_vl_moe", "qwen3-vl-4b", {}, "runs as qwen3-vl-30b-a3b"),
      ("dense_checkpoint_on_the_moe_name", "qwen3_vl", "qwen3-vl-30b-a3b", {}, "qwen3-vl-2b or qwen3-vl-4b"),
      ("mrope_sections_not_half_the_head", "qwen3_vl", None,
       {"text_config": {"rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [8, 8, 8]}}},
       "split head_dim/2 = 16"),
      ("mrope_not_interleaved", "qwen3_vl", None,
       {"text_config": {"rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [6, 5, 5],
                                            "mrope_interleaved": False}}}, "mrope_interleaved=false"),
      ("qwen3_vl_dense_layers_among_moe", "qwen3_vl_moe", None, {"text_config": {"mlp_only_layers": [1]}},
       "mlp_only_layers"),
      ("weaver_on_a_name_maxtext_lacks", "weaver", "weaver-huge", {}, "weaver-mini and weaver-max"),
      ("weaver_moe_decoder", "weaver", None, {"text_config": {"num_experts": 4}}, "mixture-of-experts Weaver"),
      ("weaver_image_token_moved", "weaver", None, {"image_token_id": 151654}, "hard-codes 151655"),
      ("weaver_mrope_not_interleaved", "weaver", None,
       {"text_config": {"rope_parameters": {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [6, 5, 5],
                                            "mrope_interleaved": False}}}, "mrope_interleaved=false"),
  )
  def test_qwen_vision_refused_with_the_reason(self, model, target, changes, text):
    with self.assertRaisesRegex(ConversionError, text):
      _resolve(model, target, **changes).warnings()

  def test_qwen_vision_expressible_configs_convert_without_warnings(self):
    for model in ("qwen3_vl", "qwen3_vl_moe", "qwen3_5_mm", "weaver"):
      resolved = _resolve(model)
      self.assertEqual(resolved.warnings(), [], model)
      self.assertTrue(resolved.multimodal, model)

  def test_qwen3_5_fp8_names_leave_the_tower_out(self):
    # MaxText's qwen3.5-*-fp8 names refuse use_multimodal: the tower is skipped with one warning saying so.
    resolved = _resolve("qwen3_5_mm", "qwen3.5-35b-a3b-fp8")
    self.assertFalse(resolved.multimodal)
    self.assertLen([w for w in resolved.warnings() if "vision tower (model.visual.*) is not converted" in w], 1)
    self.assertIn("fp8", next(r for p, r in resolved.ignored_tensors().items() if "visual" in p))

  def test_qwen3_vl_moe_expert_layout_by_shape_even_when_e_is_2m(self):
    # Hidden 96 = 2 x 48: gate_up_proj has one shape in both layouts, down_proj tells them apart.
    resolved = _resolve("qwen3_vl_moe", text_config={"hidden_size": 96}, vision_config={"out_hidden_size": 96})
    group = resolved.layout(resolved.config.vocab_size, False).groups[0]
    experts = "model.language_model.layers.0.mlp.experts"
    for down, layout in (((4, 48, 96), "hub"), ((4, 96, 48), "saved")):
      stored = {f"{experts}.gate_up_proj": (4, 96, 96), f"{experts}.down_proj": down}
      params = group.resolved(lambda name, stored=stored: stored.get(name, (0,))).params
      wo = next(p for p in params if p.maxtext == "moe_block/wo")
      self.assertEqual(tuple(wo.hf_shape), down, layout)
      self.assertEqual(bool(wo.ops), layout == "saved")

  def test_qwen_text_only_keeps_the_decoder_keys(self):
    # --text_only: no tower keys but the empty deepstack list that lets MaxText scan a qwen3-vl name.
    model = families.resolve(parse_model_config(tiny_models.config_json("qwen3_vl"), "config.json"), text_only=True)
    overrides = model.runtime.config.overrides()
    self.assertEqual((overrides["use_multimodal"], overrides["deepstack_visual_indexes_for_vit"]), (False, []))
    self.assertNotIn("hidden_size_for_vit", overrides)
    self.assertIn("(--text_only)", model.ignored_tensors()[r"model\.visual\."])

  def test_weaver_text_only_skips_exactly_the_tower(self):
    # Weaver's names have no `model.visual.` prefix: the tower's own leading names say what --text_only skips.
    full = _resolve("weaver")
    text_only = families.resolve(full.config, text_only=True)
    skipped = [re.compile(p) for p, reason in text_only.ignored_tensors().items() if "(--text_only)" in reason]
    layout = text_only.layout(full.config.vocab_size, False)
    text = [p.hf.format(layer=0) for p in layout.top + layout.groups[0].params]
    self.assertEqual([n for n in text if any(p.match(n) for p in skipped)], [])
    self.assertEqual([p.hf for p in full.towers.params if not any(r.match(p.hf) for r in skipped)], [])


  # Qwen3-Omni nests every setting under thinker_config (its text, vision and audio configs one level deeper).
  @staticmethod
  def _omni(target: str | None = None, *, text=None, vision=None, audio=None, text_only=False,
            **thinker) -> families.ResolvedModel:
    """The tiny Omni thinker's config.json with `thinker` keys changed (None: left out of config.json) and the
    nested configs' keys updated."""
    raw = tiny_models.config_json("qwen3_omni")
    t = raw["thinker_config"] = {k: v for k, v in {**raw["thinker_config"], **thinker}.items() if v is not None}
    for key, changes in (("text_config", text), ("vision_config", vision), ("audio_config", audio)):
      t[key] = {**t[key], **(changes or {})}
    return families.resolve(parse_model_config(raw, "config.json"), target_model=target, text_only=text_only)

  @parameterized.named_parameters(
      ("omni_audio_placeholder_left_to_transformers", {"audio_token_id": None},
       r"audio_token_id=151646 \(transformers' default\), MaxText hard-codes 151675"),
      ("omni_audio_start_moved", {"audio_start_token_id": 151647}, "audio_start_token_id=151647, MaxText hard-codes"
       " 151669"),
      ("omni_audio_end_moved", {"audio_end_token_id": 151671}, "audio_end_token_id=151671, MaxText hard-codes 151670"),
      ("omni_image_token_moved", {"image_token_id": 151654}, "image_token_id=151654: MaxText 0.2.5 hard-codes 151655"),
      ("omni_vision_start_moved", {"vision_start_token_id": 151650}, "vision_start_token_id=151650"),
      ("omni_audio_output_not_the_text_width", {"audio": {"output_dim": 96}},
       "output_dim=96 differs from the text hidden_size=64"),
      ("omni_audio_heads_do_not_divide", {"audio": {"encoder_attention_heads": 3}},
       "d_model=128 is not a multiple of encoder_attention_heads=3"),
      ("omni_audio_activation_not_gelu", {"audio": {"activation_function": "relu"}},
       "activation_function='relu': MaxText's audio convs"),
      ("omni_audio_dims_missing", {"audio": {"n_window": None}}, "missing required key audio_config.n_window"),
      ("omni_rope_scaling", {"text": {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6,
                                                           "mrope_section": [6, 5, 5]}}}, "applies no rope scaling"),
      ("omni_mrope_sections_not_half_the_head", {"text": {"rope_parameters": {"rope_type": "default",
                                                                                "rope_theta": 1e6,
                                                                                "mrope_section": [8, 5, 5]}}},
       "must split head_dim/2 = 16"),
      ("omni_dense_layers_among_moe", {"text": {"mlp_only_layers": [1]}}, "dense layers among MoE layers"),
      ("omni_other_model_name", {"target": "qwen3-omni-7b"}, "one Qwen3-Omni model, qwen3-omni-30b-a3b"),
  )
  def test_qwen3_omni_refused_with_the_reason(self, changes, text):
    with self.assertRaisesRegex(ConversionError, text):
      model = self._omni(**changes)
      model.layout(model.config.vocab_size, False)
      model.warnings()

  @parameterized.named_parameters(
      ("processor_chunk", {"n_window": 40}, "hard-codes chunks of 100"),
      ("attention_window_past_the_chunk", {"n_window_infer": 400}, "attends across the 100-frame chunks"),
  )
  def test_qwen3_omni_audio_windows_warn(self, audio, text):
    warnings = self._omni(audio=audio).warnings()
    self.assertLen([w for w in warnings if text in w], 1, warnings)

  def test_qwen3_omni_converts_without_warnings(self):
    model = self._omni()
    self.assertEqual(model.warnings(), [])
    self.assertEqual(model.target, "qwen3-omni-30b-a3b")
    overrides = model.runtime.config.overrides()
    keys = ("use_multimodal", "use_audio", "deepstack_visual_indexes_for_vit", "position_id_per_seconds")
    self.assertEqual([overrides[k] for k in keys], [True, True, [0, 1], 13])

  def test_qwen3_omni_scans_only_without_its_towers(self):
    # The deepstack mergers feed single decoder layers: refused scanned before any tensor is read (no source).
    model = self._omni()
    with self.assertRaisesRegex(ConversionError, "deepstack.*--scan_layers=false"):
      plan.build_plan(None, model, PlanOptions(scan_layers=True))
    text = self._omni(text_only=True)
    overrides = text.runtime.config.overrides()
    keys = ("use_multimodal", "use_audio", "deepstack_visual_indexes_for_vit")
    self.assertEqual([overrides[k] for k in keys], [False, False, []])
    self.assertNotIn("d_model_for_audio", overrides)
    self.assertEqual([g.path for g in text.layout(text.config.vocab_size, True).groups], [("decoder", "layers")])

  def test_qwen3_omni_skips_the_speech_output_modules(self):
    ignored = self._omni(text_only=True).ignored_tensors()
    for name in ("talker.model.layers.0.mlp.gate.weight", "code2wav.decoder.0.conv.weight",
                 "thinker.audio_tower.conv2d1.weight", "thinker.visual.blocks.0.attn.qkv.weight"):
      self.assertTrue(any(re.match(pattern, name) and reason for pattern, reason in ignored.items()), name)
    self.assertFalse(any(re.match(p, "thinker.model.layers.0.mlp.gate.weight") for p in ignored))

  # DeepSeek V4: the hub's config keys (the tiny row's config.json) and transformers' alike.
  def _transformers_form(self, **changes) -> families.ResolvedModel:
    import transformers  # pylint: disable=g-import-not-at-top

    spec = tiny_models.TINY_MODELS["deepseek4"]
    raw = transformers.DeepseekV4Config(**{**spec.config, **changes}).to_dict()
    return families.resolve(parse_model_config(dict(raw, architectures=[spec.model_class]), "config.json"))

  def test_deepseek4_converts_with_the_shared_expert_clamp_warning_alone(self):
    warnings = _resolve("deepseek4").warnings()
    self.assertLen(warnings, 1, warnings)
    self.assertIn("clamps the routed experts only", warnings[0])

  def test_deepseek4_hub_and_transformers_config_styles_agree(self):
    hub, saved = _resolve("deepseek4"), self._transformers_form()
    self.assertEqual(hub.runtime.config.overrides(), saved.runtime.config.overrides())
    for scan in (True, False):
      self.assertEqual(hub.layout(509, scan), saved.layout(509, scan))
    self.assertEqual(hub.runtime.config.compress_ratios, (0, 0, 4, 128, 4, 128, 4))
    self.assertEqual((hub.runtime.config.rope_max_timescale, hub.runtime.config.compressed_rope_max_timescale,
                      hub.runtime.config.qk_rope_head_dim, hub.runtime.config.first_num_hash_layers),
                     (20000.0, 80000.0, 16, 3))

  @parameterized.named_parameters(
      ("hub_yarn_on_compressed_layers", {"rope_scaling": {"type": "yarn", "factor": 16, "beta_fast": 32,
                                                          "beta_slow": 1,
                                                          "original_max_position_embeddings": 65536}},
       "rope_scaling asks for yarn rope scaling on the compressed layers"),
      ("hc_eps", {"hc_eps": 1e-5}, "hc_eps=1e-05"),
      ("head_norm_eps", {"rms_norm_eps": 1e-5}, "head norm hard-codes"),
      ("scoring_func", {"scoring_func": "sigmoid"}, "sqrtsoftplus"),
  )
  def test_deepseek4_one_precise_warning(self, changes, text):
    warnings = _resolve("deepseek4", **changes).warnings()
    self.assertLen([w for w in warnings if text in w], 1, warnings)

  def test_deepseek4_transformers_yarn_names_its_key(self):
    yarn = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536, "beta_fast": 32.0,
            "beta_slow": 1.0, "rope_theta": 80000.0, "partial_rotary_factor": 0.25}
    model = self._transformers_form(rope_parameters={
        "main": {"rope_type": "default", "rope_theta": 20000.0, "partial_rotary_factor": 0.25}, "compress": yarn})
    self.assertLen([w for w in model.warnings() if "rope_parameters asks for yarn" in w], 1, model.warnings())

  @parameterized.named_parameters(
      ("odd_remainder", {"num_hidden_layers": 6, "compress_ratios": [0, 0, 4, 128, 4, 128]}, True,
       r"compress_ratios gives the layers after the first 3 \(num_hash_layers\) the ratios \[128, 4, 128\]"),
      ("pairs_not_128_then_4", {"compress_ratios": [0, 0, 4, 4, 128, 4, 128]}, True, "--scan_layers=false"),
      ("ratio_below_4", {"compress_ratios": [0, 0, 4, 128, 4, 128, 2]}, False, "0 \\(sliding window\\), 4"),
      ("too_few_ratios", {"compress_ratios": [0, 0, 4]}, False, "3 entries for 7 layers"),
      ("several_kv_heads", {"num_key_value_heads": 2}, False, "one shared key/value head"),
  )
  def test_deepseek4_refused_with_the_reason(self, changes, scan, text):
    with self.assertRaisesRegex(ConversionError, text):
      model = _resolve("deepseek4", **changes)
      model.warnings()
      model.layout(509, scan)

  def test_deepseek4_scans_any_ratios_unscanned_only(self):
    model = _resolve("deepseek4", compress_ratios=[128, 4, 0, 0, 128, 4, 0])
    self.assertLen(model.layout(509, False).groups, 7)
    with self.assertRaisesRegex(ConversionError, "compress_ratios"):
      model.layout(509, True)

  def test_deepseek4_transformers_layer_kinds_refused_with_the_reason(self):
    with self.assertRaisesRegex(ConversionError, "compress_rates.*CSA exactly when its ratio is 4"):
      self._transformers_form(compress_rates={"compressed_sparse_attention": 8,
                                              "heavily_compressed_attention": 128})
    with self.assertRaisesRegex(ConversionError, "mlp_layer_types.*hash-routed layers after top-k ones"):
      self._transformers_form(mlp_layer_types=["hash_moe", "moe", "hash_moe"] + ["moe"] * 4)

  def test_deepseek4_skips_the_mtp_block(self):
    ignored = _resolve("deepseek4").ignored_tensors()
    self.assertTrue(any(re.match(p, "mtp.0.e_proj.weight") and r for p, r in ignored.items()))
    self.assertFalse(any(re.match(p, "layers.0.ffn.gate.weight") for p in ignored))



class RopeScalingShapeTest(absltest.TestCase):
  """rope_scaling transformers could not read is refused naming config.json and the key, for every family."""

  def _resolve(self, **changes):
    config = parse_model_config(dict(TINY_QWEN3_CONFIG, **changes), "/m/config.json")
    return families.resolve(config)

  def test_impossible_shapes_are_refused_by_key(self):
    for changes, reason in [({"rope_scaling": [1, 2]}, "rope_scaling is \\[1, 2\\]"),
                            ({"rope_scaling": {"rope_type": "yarn", "factor": "x"}}, "rope_scaling.factor is 'x'"),
                            ({"rope_scaling": {"rope_type": "yarn", "factor": float("inf")}}, "rope_scaling.factor is inf"),
                            ({"rope_scaling": {"rope_type": "nope"}}, "rope_scaling.rope_type 'nope' is not"),
                            ({"rope_scaling": {"factor": 4.0}}, "rope_scaling has a factor but no rope_type"),
                            ({"rope_parameters": {"full_attention": {"rope_type": 3}}},
                             "rope_parameters.full_attention.rope_type 3 is not"),
                            ({"rope_scaling": {"type": "mrope", "mrope_section": [16, "x"]}},
                             "rope_scaling.mrope_section is")]:
      with self.subTest(reason=reason):
        with self.assertRaisesRegex(ConversionError, f"^/m/config.json: {reason}"):
          self._resolve(**changes)

  def test_readable_shapes_pass(self):
    for changes in [{"rope_scaling": None}, {"rope_scaling": {"rope_type": "default"}},
                    {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
                    {"rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}]:
      with self.subTest(changes=changes):
        self._resolve(**changes)


if __name__ == "__main__":
  absltest.main()
