"""The MaxText config a conversion records comes back from the record as the same config, towers included."""

from absl.testing import absltest

from converter.families.runtime import MaxTextConfig


class MaxTextConfigTest(absltest.TestCase):

  def test_recorded_overrides_come_back_as_the_same_config(self):
    config = MaxTextConfig(
        base_emb_dim=256, base_num_query_heads=4, base_num_kv_heads=2, base_mlp_dim=320, base_num_decoder_layers=8,
        vocab_size=509, normalization_layer_epsilon=1e-6, rope_max_timescale=1e6, logits_via_embedding=True,
        mrope_section=(2, 2, 4), use_multimodal=True,
        towers=(("image_size_for_vit", 64), ("deepstack_visual_indexes_for_vit", (0, 2))))
    overrides = config.overrides()
    # The towers' keys are MaxText keys like any other, after the decoder's; `towers` itself is not one.
    self.assertNotIn("towers", overrides)
    self.assertEqual(list(overrides)[-2:], ["image_size_for_vit", "deepstack_visual_indexes_for_vit"])
    recorded = {k: list(v) if isinstance(v, tuple) else v for k, v in overrides.items()}  # As JSON keeps them.
    self.assertEqual(MaxTextConfig.from_overrides(recorded).overrides(), overrides)


if __name__ == "__main__":
  absltest.main()
