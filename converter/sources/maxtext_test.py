"""A MaxText checkpoint as a source: which tree holds its weights (a Linen TrainState, Tunix's NNX state), its
leaves and their per-layer slices read back as stored, and what it states of itself for the record."""

import os
import shutil
import tempfile

import numpy as np
import tensorstore as ts
from absl.testing import absltest

from converter import conversion
from converter.checkpoint_format import layout
from converter.errors import ConversionError
from converter.options import PlanOptions, RunContext, SaveOptions
from converter.output.maxtext import MaxTextOutput
from converter.output.record import conversion_record
from converter.sources import maxtext
from converter.sources.checkpoint_reader import CheckpointReader


class ModelTreeTest(absltest.TestCase):

  def test_a_train_state_keeps_its_weights_under_params_params(self):
    tree = maxtext.model_tree({("params", "params", "decoder", "w"): 1, ("opt_state", "mu", "w"): 2}, "ITEMS")
    self.assertEqual(tree.params, {("decoder", "w"): 1})
    self.assertEqual(tree.show(("decoder", "w")), "params/params/decoder/w")

  def test_an_nnx_state_drops_its_random_streams_and_folds_list_indices(self):
    arrays = {("base", "decoder", "layers", "0", "mlp", "kernel", "value"): 1,
              ("base", "decoder", "rngs", "params", "key", "value"): 2,
              ("base", "decoder", "rngs", "params", "count", "value"): 3}
    tree = maxtext.model_tree(arrays, "ITEMS")
    self.assertEqual(tree.params, {("decoder", "layers_0", "mlp", "kernel"): 1})
    self.assertEqual(tree.show(("decoder", "layers_0", "mlp", "kernel")), "base/decoder/layers_0/mlp/kernel/value")

  def test_lora_factors_alone_and_other_trees_are_refused_by_what_they_hold(self):
    with self.assertRaisesRegex(ConversionError, "LoRA factors only.*--lora_checkpoint_path"):
      maxtext.model_tree({("decoder", "q", "kernel_lora_a", "value"): 1}, "ITEMS")
    with self.assertRaisesRegex(ConversionError, "ITEMS: neither a MaxText TrainState.*under: opt_state, step"):
      maxtext.model_tree({("opt_state", "mu"): 1, ("step",): 2}, "ITEMS")


class MaxTextSourceTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    plan = conversion.plan_conversion("testdata/tiny-qwen3", PlanOptions(scan_layers=True, save_dtype="float32"))
    out = os.path.join(tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir()), "out")
    cls.items = MaxTextOutput(out, RunContext()).write(plan, SaveOptions(devices=1), conversion_record(plan, {})
                                                       ).items_path
    cls.source = maxtext.open_maxtext(cls.items)

  def test_a_layer_of_a_stacked_leaf_reads_as_that_slice_of_the_stored_array(self):
    name = "decoder/layers/mlp/wi_0/kernel"
    tensor = self.source.tensors[name]
    reader = CheckpointReader(self.items)
    array = reader.arrays[("params", "params", *name.split("/"))]
    stored = reader.open(array, (), 1 << 20).read(tuple(slice(0, d) for d in array.shape))
    np.testing.assert_array_equal(tensor.read(), stored)
    layer = tensor.at(((1, 1),))  # The scan axis.
    self.assertEqual(layer.name, f"params/params/{name}[1=1]")
    self.assertEqual(layer.shape, stored.shape[:1] + stored.shape[2:])
    self.assertEqual(layer.stored_index((slice(2, 5),)), (slice(2, 5), 1, slice(None)))
    np.testing.assert_array_equal(layer.read(region=(slice(2, 5),)), stored[2:5, 1])
    np.testing.assert_array_equal(layer.read(np.float64, transpose=True), stored[:, 1].T.astype(np.float64))
    self.assertEqual(layer.files, (os.path.join(self.items, layout.TREE_METADATA),))

  def test_it_states_its_record_and_its_read_cache(self):
    facts = self.source.facts
    self.assertIs(facts.original, self.source.record)
    self.assertEqual((facts.original.family, facts.quant_method, facts.lora_adapter), ("qwen3", None, None))
    self.assertGreater(self.source.read_cache_bytes, 0)
    self.assertEqual(self.source.files, (os.path.join(self.items, layout.TREE_METADATA),))

  def test_a_leaf_stored_in_another_dtype_than_the_record_says_is_refused(self):
    step = os.path.join(tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir()), "0")
    shutil.copytree(os.path.dirname(self.items), step)
    items = os.path.join(step, layout.ITEMS)
    store = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{items}"}).result()
    key = "params.params.decoder.decoder_norm.scale/zarr.json"
    store.write(key, store.read(key).result().value.replace(b'"float32"', b'"bfloat16"')).result()
    with self.assertRaisesRegex(ConversionError, f"{items}: leaf params/params/decoder/decoder_norm/scale is stored"
                                f" as bfloat16 .* {step}/_CHECKPOINT_METADATA records the checkpoint as saved in"
                                " float32"):
      maxtext.open_maxtext(items)


if __name__ == "__main__":
  absltest.main()
