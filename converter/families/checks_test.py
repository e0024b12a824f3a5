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
  )
  def test_one_precise_warning(self, model, changes, text):
    warnings = _resolve(model, **changes).warnings()
    matching = [w for w in warnings if text in w]
    self.assertLen(matching, 1, warnings)

  def test_expressible_configs_convert_without_warnings(self):
    for model in ("deepseek2", "deepseek3", "deepseek3.2", "gpt_oss", "llama4_16e", "llama4_128e"):
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


if __name__ == "__main__":
  absltest.main()
