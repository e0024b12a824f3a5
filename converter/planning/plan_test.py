"""Plan loaders: any block a loader hands out equals the same region of the whole tensor, bit for bit."""

import json
import os
import tempfile
from unittest import mock

import numpy as np
from absl.testing import absltest, parameterized

from converter import families, ops
from converter.planning import loaders, plan
from converter.errors import ConversionError
from converter.model_config import load_model_config
from converter.layout.chunking import ChunkRule
from converter.options import PlanOptions
from converter.sources import open_source
from handlers import LazyTensor, block_indices
from tools.testing import tiny_models
from tools.checkpoint_io import read_safetensors_dir
from tools.make_tiny_checkpoint import TINY_QWEN3_CONFIG, tiny_qwen3_tensors
from tools.safetensors_writer import write_safetensors


def _assembled(leaf):
  lazy = LazyTensor(leaf.name, leaf.shape, leaf.dtype, leaf.loader)
  out = np.zeros(leaf.shape, leaf.dtype)
  for index in block_indices(leaf.shape, lazy.block_shape):
    out[index] = lazy.read(index)
  return out, lazy.block_shape


class PlanLoadersTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model_dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    with open(os.path.join(cls.model_dir, "config.json"), "w") as f:
      json.dump(TINY_QWEN3_CONFIG, f)
    write_safetensors(os.path.join(cls.model_dir, "model.safetensors"), tiny_qwen3_tensors(TINY_QWEN3_CONFIG))

  def _plan(self, **kwargs):
    config = load_model_config(self.model_dir)
    return plan.build_plan(open_source(self.model_dir, config.raw, config.path), families.resolve(config),
                           PlanOptions(save_dtype=kwargs.pop("save_dtype", "float32"), **kwargs))

  @parameterized.parameters((True, "float32"), (False, "bfloat16"))
  def test_blocks_reassemble_every_leaf(self, scan_layers, save_dtype):
    # Row blocks kick in for any tensor above the threshold; a tiny threshold exercises them on tiny tensors.
    with mock.patch.object(loaders, "ROW_BLOCK_BYTES", 2048):
      the_plan = self._plan(scan_layers=scan_layers, save_dtype=save_dtype, target_vocab_size=300)
      block_shapes = {}
      for leaf in the_plan.leaves:
        assembled, block_shapes[leaf.name] = _assembled(leaf)
        whole = leaf.loader()
        self.assertEqual(assembled.tobytes(), whole.tobytes(), leaf.name)
    self.assertLess(block_shapes["token_embedder/embedding"][0], 300)  # Rows in slabs, vocab padded to 300.
    self.assertLess(block_shapes["decoder/logits_dense/kernel"][1], 300)

  def test_chunks_hold_maxtext_element_order_unless_huggingface_order_is_asked(self):
    # A transposed kernel's chunks keep the HuggingFace tensor's element order only when asked: a restore undoes
    # that order while it decodes, at two to three times a plain chunk's CPU.
    default = {leaf.name: leaf for leaf in self._plan().leaves}
    kept = {leaf.name: leaf for leaf in
            self._plan(chunking=ChunkRule(huggingface_element_order=True)).leaves}
    kernel = "decoder/layers/mlp/wo/kernel"
    self.assertIsNotNone(default[kernel].chunk_shape)
    self.assertIsNone(default[kernel].element_order)
    self.assertFalse(any(leaf.element_order for leaf in default.values()))
    self.assertIsNotNone(kept[kernel].element_order)
    for name, leaf in kept.items():  # The same values either way.
      self.assertEqual(leaf.loader().tobytes(), default[name].loader().tobytes(), name)
    self.assertEqual(ChunkRule(huggingface_element_order=True).record()["element_order"], "huggingface")
    self.assertNotIn("element_order", ChunkRule().record())

  @parameterized.parameters("llama3.1", "deepseek3", "gpt_oss", "llama4_128e", "deepseek4")
  def test_slabs_reassemble_every_leaf_of_every_kind(self, model):
    # Heads of q/k/v kernels (with the llama3.1 permutation and the baked query scale), the last axis of output
    # kernels, latent-attention kernels, one expert's rows of a fused gate/up split interleaved or in halves.
    model_dir = tiny_models.build_tiny_model(model, tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")))
    config = load_model_config(model_dir)
    with mock.patch.object(loaders, "ROW_BLOCK_BYTES", 4096):
      the_plan = plan.build_plan(open_source(model_dir, config.raw, config.path), families.resolve(config),
                                 PlanOptions(scan_layers=True, save_dtype="float32"))
      slabbed = 0
      for leaf in the_plan.leaves:
        assembled, block = _assembled(leaf)
        slabbed += block != leaf.shape
        self.assertEqual(assembled.tobytes(), leaf.loader().tobytes(), leaf.name)
    self.assertGreater(slabbed, len(the_plan.leaves) // 2)

  def test_float32_tensors_a_family_keeps_are_not_rounded_to_the_save_dtype(self):
    # DeepSeek V4's mixers, sinks, position biases and gate bias keep the float32 they are stored in; every other
    # leaf is bfloat16, and a checkpoint that stores them in bfloat16 gets bfloat16 leaves.
    kept = ("_alpha", "_beta", "_alpha_scale", "/sinks", "/position_bias", "/gate/bias", "/hc_head/")
    for stored in ("float32", "bfloat16"):
      model_dir = tiny_models.build_tiny_model("deepseek4", tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")),
                                               dtype=stored)
      config = load_model_config(model_dir)
      the_plan = plan.build_plan(open_source(model_dir, config.raw, config.path), families.resolve(config),
                                 PlanOptions(scan_layers=True, save_dtype="bfloat16"))
      dtypes = {leaf.name: leaf.dtype.name for leaf in the_plan.leaves}
      float32 = sorted(name for name, dtype in dtypes.items() if dtype == "float32")
      expected = sorted(name for name in dtypes if stored == "float32" and any(k in name for k in kept))
      self.assertEqual(float32, expected)
      self.assertGreater(len(dtypes), len(float32))
      if stored == "float32":
        self.assertTrue(any(name.endswith("/sinks") for name in float32))
        sinks = next(leaf for leaf in the_plan.leaves if leaf.name.endswith("layers_0/self_attention/sinks"))
        stored_sinks = read_safetensors_dir(model_dir)["layers.0.attn.attn_sink"]
        np.testing.assert_array_equal(sinks.loader(), stored_sinks)  # Not rounded on the way.

  def test_integer_ids_a_save_dtype_cannot_hold_are_refused(self):
    # DeepSeek V4's hash table (I64 on disk) is read as floats; a save dtype that rounds some id is refused.
    model_dir = tiny_models.build_tiny_model("deepseek4", tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")))
    config = load_model_config(model_dir)
    build = lambda dtype: plan.build_plan(open_source(model_dir, config.raw, config.path),  # pylint: disable=g-long-lambda
                                          families.resolve(config), PlanOptions(scan_layers=False, save_dtype=dtype))
    table = next(leaf for leaf in build("bfloat16").leaves if leaf.name == "decoder/layers_0/mlp/MoeBlock_0/tid2eid")
    np.testing.assert_array_equal(table.loader().astype(np.int64), read_safetensors_dir(model_dir)[
        "layers.0.ffn.gate.tid2eid"])
    with mock.patch.object(ops.IntegerIds, "exact_in", return_value=False):
      with self.assertRaisesRegex(ConversionError, r"tensor 'layers.0.ffn.gate.tid2eid' holds ids up to 7, which"
                                  r" --save_dtype=bfloat16 cannot all represent exactly"):
        build("bfloat16")

  def test_padded_vocab_rows_are_zero(self):
    with mock.patch.object(loaders, "ROW_BLOCK_BYTES", 2048):
      leaf = next(l for l in self._plan(scan_layers=True, target_vocab_size=300).leaves
                  if l.name == "token_embedder/embedding")
      assembled, _ = _assembled(leaf)
    np.testing.assert_array_equal(assembled[257:], 0)

  def test_scanned_block_is_one_layer(self):
    leaf = next(l for l in self._plan(scan_layers=True).leaves if l.name.endswith("query/kernel"))
    lazy = LazyTensor(leaf.name, leaf.shape, leaf.dtype, leaf.loader)
    self.assertEqual(lazy.block_shape, (64, 1, 4, 24))


class LayoutNamesTest(absltest.TestCase):
  """A family's aliases rename a checkpoint's other names for a tensor to the ones its layout uses."""

  def _source(self, *names):
    tensor = lambda name: mock.Mock(name=name, files=("model.safetensors",))
    tensors = {n: tensor(n) for n in names}
    for n, t in tensors.items():
      t.name = n
    return mock.Mock(location="/ckpt", tensors=tensors)

  ALIASES = ((r"^model\.vision_tower\.(vision_model\.)?", "vision_tower.vision_model."),
             (r"^vision_tower\.(?!vision_model\.)", "vision_tower.vision_model."))

  def test_each_naming_lands_on_the_layout_name_and_keeps_its_stored_name(self):
    for stored in ("vision_tower.vision_model.post_layernorm.weight", "vision_tower.post_layernorm.weight",
                   "model.vision_tower.post_layernorm.weight", "model.vision_tower.vision_model.post_layernorm.weight"):
      named = plan.layout_names(self._source(stored, "lm_head.weight"), self.ALIASES)
      self.assertEqual(sorted(named), ["lm_head.weight", "vision_tower.vision_model.post_layernorm.weight"])
      self.assertEqual(named["vision_tower.vision_model.post_layernorm.weight"].name, stored)

  def test_two_names_of_one_weight_are_refused_naming_both(self):
    source = self._source("vision_tower.post_layernorm.weight", "vision_tower.vision_model.post_layernorm.weight")
    with self.assertRaisesRegex(plan.ConversionError, "vision_tower.post_layernorm.weight.*two names of one weight"):
      plan.layout_names(source, self.ALIASES)


if __name__ == "__main__":
  absltest.main()
