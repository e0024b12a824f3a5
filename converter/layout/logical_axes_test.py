"""Leaves' MaxText logical axes (the interop step checks every family's against MaxText itself; these pin the
facts the chunk grids depend on most)."""

from absl.testing import absltest

from converter.layout import logical_axes


class LogicalAxesTest(absltest.TestCase):

  def test_decoder_leaves(self):
    self.assertEqual(logical_axes.per_layer("self_attention/query/kernel", 3), ("embed_attn", "q_heads", "kv"))
    self.assertEqual(logical_axes.per_layer("self_attention/out/kernel", 3), ("heads", "kv", "embed_attn"))
    self.assertEqual(logical_axes.per_layer("mlp/wo/kernel", 2), ("mlp", "embed"))
    self.assertEqual(logical_axes.per_layer("token_embedder/embedding", 2), ("vocab", "embed_vocab"))
    self.assertEqual(logical_axes.per_layer("decoder/logits_dense/kernel", 2), ("embed_vocab", "vocab"))
    self.assertEqual(logical_axes.per_layer("moe_block/wi_0", 3), ("exp", "embed_moe", "mlp_moe"))
    # DeepSeek's and Gemma 4's routers are `embed_router`, Mixtral's and Qwen3-MoE's `embed`.
    self.assertEqual(logical_axes.per_layer("DeepSeekMoeBlock_0/MoeBlock_0/gate/kernel", 2), ("embed_router", None))
    self.assertEqual(logical_axes.per_layer("MoeBlock_0/gate/kernel", 2), ("embed", None))

  def test_stacked_leaves_have_their_layer_axes_at_the_scan_axis(self):
    self.assertEqual(logical_axes.stacked(("exp", "embed_moe", "mlp_moe"), 1, ("layers", "local_layers")),
                     ("exp", "layers", "local_layers", "embed_moe", "mlp_moe"))
    self.assertIsNone(logical_axes.stacked(None, 1, ("layers",)))

  def test_unannotated_leaves(self):
    for path, rank in (("vision_encoder/Qwen3VLVisionEncoder_0/blocks_0/ln1/scale", 1),
                       ("vision_encoder/Gemma3VisionEncoderLayer_0/embedding/kernel", 4),
                       ("attention/A_log", 1), ("input_layernorm/scale", 1), ("attention/conv1d/kernel", 3),
                       ("self_attention/indexer/k_norm/scale", 1)):
      self.assertIsNone(logical_axes.per_layer(path, rank), path)
    # ... but towers' attention and Gemma 4's tower norms are annotated, as in the decoders.
    self.assertEqual(logical_axes.per_layer(
        "vision_encoder/Gemma3VisionEncoderLayer_0/Transformer/encoderblock_0/MultiHeadDotProductAttention_0/key/kernel",
        3), ("embed_attn", "kv_heads", "kv_head_dim"))
    self.assertEqual(logical_axes.per_layer("vision_encoder/Gemma4VisionEncoderLayer_0/layer_0/pre_ffw_norm/scale",
                                            1), ("norm",))


if __name__ == "__main__":
  absltest.main()
