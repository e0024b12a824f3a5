"""MaxText -> MaxText: a checkpoint laid out again equals the forward conversion straight to that layout, leaf for
leaf and bit for bit (float32), for families whose layers stack in every way MaxText stacks them: one scanned
`layers` subtree (Qwen3), dense and MoE collections (DeepSeek), blocks of layers with a remainder (Gemma 3),
interleaved MoE layers (Llama 4), nested blocks (Gemma 4), towers beside the decoder (Gemma 3 multimodal); and
what is not a model checkpoint of the family is refused naming the leaf.

No Orbax checkpoint is written: the source's stored arrays are the forward plan's leaf values (a stand-in for the
TensorStore reads), so only the planning and the region reads are under test here; integration_tests/
relayout_test.py and the MaxText interop run the real thing."""

import dataclasses
import json
import os
import tempfile
from unittest import mock

import numpy as np
from absl.testing import absltest, parameterized

from converter import families
from converter.planning import plan, relayout
from converter.sources.checkpoint_reader import StoredArray
from converter.errors import ConversionError
from converter.planning.loaders import Copy, Stack
from converter.model_config import load_model_config
from converter.options import PlanOptions
from converter.checkpoint_format.record import ConversionRecord
from converter.sources import maxtext, open_source
from tools.testing import tiny_models

FAMILIES = ("qwen3", "deepseek3", "gemma3", "llama4_16e", "gemma4_moe", "gemma3_mm")


def _tmpdir() -> str:
  return tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))


def _forward(model_dir: str, **options) -> plan.Plan:
  config = load_model_config(model_dir)
  return plan.build_plan(open_source(model_dir, config.raw, config.path), families.resolve(config),
                         PlanOptions(**options))


class _Stored:
  """A stored array as the reader opens it: `read(index)` of an in-memory value."""

  def __init__(self, value: np.ndarray):
    self.value = value

  def read(self, index):
    return np.array(self.value[index])


class _StandIn:
  """A MaxText checkpoint made of a forward plan's leaf values: `open_maxtext` and the reads it serves."""

  def __init__(self, forward: plan.Plan, prefix=maxtext.PARAMS, suffix=(), extra=None, drop=(), record=None):
    self.items = _tmpdir()
    self.values = {prefix + leaf.path + suffix: np.asarray(leaf.loader(), leaf.dtype) for leaf in forward.leaves
                   if leaf.name not in drop}
    self.values.update(extra or {})
    self.record = record or ConversionRecord(scan_layers=forward.scan_layers, family=forward.family.name,
                                             target_model=forward.target_model, hf_config=dict(forward.config.raw),
                                             fp8=dataclasses.asdict(forward.fp8) if forward.fp8 else None)

  def open_maxtext(self, items_path, raw_fp8=False):
    arrays = {keys: StoredArray(keys, ".".join(keys), value.shape, value.dtype) for keys, value in self.values.items()}
    tree = maxtext.model_tree(arrays, items_path)
    tensors = {"/".join(path): maxtext.MaxTextTensor(items_path, array.path, array.shape, array.dtype,
                                                     raw_fp8=raw_fp8)
               for path, array in tree.params.items()}
    return maxtext.MaxTextSource(items_path, tensors, (), self.record, tree)

  def open(self, tensor):
    return _Stored(self.values[tensor.keys])

  def relayout(self, **options) -> plan.Plan:
    with mock.patch.object(relayout, "open_maxtext", wraps=self.open_maxtext) as opened, \
        mock.patch.object(ConversionRecord, "read", return_value=self.record), \
        mock.patch.object(maxtext, "_open", self.open):
      the_plan = relayout.plan_relayout(self.items, PlanOptions(**options))
      self.opens = opened.call_count
      # Each leaf whole, and its first half on every axis read as a region (the writer's blocks).
      return the_plan, {leaf.name: (leaf.loader(), leaf.loader.region(_half(leaf.shape))) for leaf in the_plan.leaves}


def _bits(value: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(value).view(np.uint8)


def _half(shape):
  return tuple(slice(0, max(1, d // 2)) for d in shape)


class RelayoutTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.models = {name: tiny_models.build_tiny_model(name, _tmpdir()) for name in FAMILIES}

  def assert_same_leaves(self, got: plan.Plan, values: dict[str, np.ndarray], expected: plan.Plan) -> None:
    self.assertEqual([(l.name, l.shape, l.dtype, l.logical_axes) for l in got.leaves],
                     [(l.name, l.shape, l.dtype, l.logical_axes) for l in expected.leaves])
    for leaf in expected.leaves:
      want = np.asarray(leaf.loader(), leaf.dtype)
      whole, half = values[leaf.name]
      np.testing.assert_array_equal(_bits(whole), _bits(want), err_msg=leaf.name)
      np.testing.assert_array_equal(_bits(half), _bits(want[_half(leaf.shape)]), err_msg=leaf.name)

  @parameterized.parameters(*FAMILIES)
  def test_scanned_float32_unscanned_equals_the_direct_conversion_bit_for_bit(self, name):
    scan = name != "gemma3_mm"  # Its tower's deepstack-free SigLIP scans; the decoder too.
    stand_in = _StandIn(_forward(self.models[name], scan_layers=scan, save_dtype="float32"))
    got, values = stand_in.relayout(scan_layers=not scan, save_dtype="float32")
    expected = _forward(self.models[name], scan_layers=not scan, save_dtype="float32")
    self.assert_same_leaves(got, values, expected)
    self.assertEqual(got.runtime.config.overrides(), expected.runtime.config.overrides())

  @parameterized.parameters("qwen3", "deepseek3", "gemma4_moe")
  def test_unscanned_to_scanned_bfloat16_equals_the_direct_conversion(self, name):
    stand_in = _StandIn(_forward(self.models[name], scan_layers=False, save_dtype="float32"))
    got, values = stand_in.relayout(scan_layers=True, save_dtype="bfloat16")
    self.assert_same_leaves(got, values, _forward(self.models[name], scan_layers=True, save_dtype="bfloat16"))

  def test_native_fp8_kernels_and_scales_are_laid_out_as_stored(self):
    """A --keep_fp8 checkpoint laid out again equals the --keep_fp8 conversion to that layout leaf for leaf: FP8
    kernels byte for byte, their float32 scales beside them, the rest in --save_dtype; the fp8 overrides kept."""
    model = tiny_models.build_tiny_model("qwen3_5_fp8", _tmpdir())
    for scan in (True, False):
      with self.subTest(scan=scan):
        stand_in = _StandIn(_forward(model, scan_layers=scan, save_dtype="bfloat16", keep_fp8=True))
        got, values = stand_in.relayout(scan_layers=not scan, save_dtype="bfloat16")
        self.assertEqual(stand_in.opens, 1)  # Its metadata read once, as stored (raw FP8).
        expected = _forward(model, scan_layers=not scan, save_dtype="bfloat16", keep_fp8=True)
        self.assert_same_leaves(got, values, expected)
        kinds = {leaf.dtype.name for leaf in got.leaves}
        self.assertEqual(kinds, {"float8_e4m3fn", "float32", "bfloat16"})
        self.assertEqual(got.fp8, expected.fp8)
        self.assertEqual(got.runtime.config.overrides(), expected.runtime.config.overrides())
    stand_in = _StandIn(_forward(model, scan_layers=True, save_dtype="bfloat16", keep_fp8=True))
    with self.assertRaisesRegex(ConversionError, "native fp8 checkpoint .* a LoRA checkpoint cannot be merged"):
      with mock.patch.object(relayout, "open_maxtext", stand_in.open_maxtext), \
          mock.patch.object(ConversionRecord, "read", return_value=stand_in.record):
        relayout.plan_relayout(stand_in.items, PlanOptions(), lora_checkpoint_path="/lora/0/items")

  def test_same_stacking_copies_each_leaf_whole(self):
    stand_in = _StandIn(_forward(self.models["deepseek3"], scan_layers=True, save_dtype="float32"))
    got, _ = stand_in.relayout(scan_layers=True, save_dtype="bfloat16")
    self.assertTrue(all(isinstance(leaf.loader, Copy) and not leaf.loader.tensor.fixed for leaf in got.leaves))
    unscanned, _ = stand_in.relayout(scan_layers=False, save_dtype="bfloat16")
    moe = next(l for l in unscanned.leaves if l.name == "decoder/moe_layers_1/DeepSeekMoeBlock_0/MoeBlock_0/wi_0")
    self.assertIsInstance(moe.loader, Copy)
    self.assertEqual(moe.loader.tensor.name, "params/params/decoder/moe_layers/DeepSeekMoeBlock_0/MoeBlock_0/wi_0[1=1]")

  def test_train_state_and_nnx_trees_give_their_params(self):
    forward = _forward(self.models["qwen3"], scan_layers=True, save_dtype="float32")
    leaves = {leaf.name: np.asarray(leaf.loader(), leaf.dtype) for leaf in forward.leaves}
    optimizer = {("opt_state", "mu", "params") + leaf.path: np.zeros(leaf.shape, np.float32)
                 for leaf in forward.leaves}
    trees = {
        "TrainState": _StandIn(forward, extra=optimizer),
        # Tunix's model_params: every Variable under .../value, its random streams beside the weights.
        "NNX": _StandIn(forward, prefix=(), suffix=("value",),
                        extra={("rngs", "params", "key", "value"): np.zeros((2,), np.uint32)}),
        "NNX under base/": _StandIn(forward, prefix=("base",), suffix=("value",)),
    }
    for kind, stand_in in trees.items():
      _, values = stand_in.relayout(scan_layers=True, save_dtype="float32")
      self.assertEqual(values.keys(), leaves.keys(), kind)
      for name, value in leaves.items():
        np.testing.assert_array_equal(values[name][0], value, err_msg=f"{kind}: {name}")

  def test_what_the_family_does_not_know_is_refused_naming_the_leaf(self):
    forward = _forward(self.models["qwen3"], scan_layers=True, save_dtype="float32")
    extra = _StandIn(forward, extra={("params", "params", "decoder", "adapter", "kernel"): np.zeros((4, 4))})
    with self.assertRaisesRegex(ConversionError, "1 leaf/leaves that qwen3 .* does not know: decoder/adapter/kernel"):
      extra.relayout()
    missing = _StandIn(forward, drop=("decoder/decoder_norm/scale",))
    with self.assertRaisesRegex(ConversionError, "leaf params/params/decoder/decoder_norm/scale is missing"):
      missing.relayout()
    wrong = _StandIn(forward)
    key = ("params", "params", "decoder", "layers", "mlp", "wo", "kernel")
    wrong.values[key] = wrong.values[key][:, :, :-1]
    with self.assertRaisesRegex(ConversionError, "leaf params/params/decoder/layers/mlp/wo/kernel has shape"):
      wrong.relayout()
    with self.assertRaisesRegex(ConversionError, "neither a MaxText TrainState .* under: opt_state, step"):
      maxtext.model_tree({("opt_state", "mu", "x"): None, ("step",): None}, "ITEMS")

  def test_forward_only_options_are_refused(self):
    forward = _forward(self.models["qwen3"], scan_layers=True, save_dtype="float32")
    stand_in = _StandIn(forward)
    with self.assertRaisesRegex(ConversionError, "takes no --keep_fp8"):
      stand_in.relayout(keep_fp8=True)
    vocab = forward.target_vocab_size
    with self.assertRaisesRegex(ConversionError, f"vocabulary of {vocab} rows, which laying it out again keeps"):
      stand_in.relayout(target_vocab_size=vocab + 3)


class MaxTextTensorTest(absltest.TestCase):

  def test_a_layer_slice_reads_its_region_from_the_stored_array(self):
    value = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    leaf = maxtext.MaxTextTensor("ITEMS", ("params", "params", "w"), value.shape, value.dtype)
    layer = leaf.at(((1, 2),))
    self.assertEqual((layer.shape, layer.name), ((2, 4, 5), "params/params/w[1=2]"))
    with mock.patch.object(maxtext, "_open", lambda tensor: _Stored(value)):
      np.testing.assert_array_equal(layer.read(), value[:, 2])
      np.testing.assert_array_equal(layer.read(region=(1, slice(1, 3))), value[1, 2, 1:3])
      np.testing.assert_array_equal(layer.read(np.float64, (slice(0, 1),), transpose=True),
                                    np.swapaxes(value[0:1, 2], -1, -2))
    self.assertEqual(Copy(layer, np.dtype(np.float32)).block_shape, (2, 4, 5))
    big = maxtext.MaxTextTensor("ITEMS", ("w",), (64, 1024, 1024), np.dtype(np.float32))
    self.assertEqual(Copy(big, np.dtype(np.float32)).block_shape, (4, 1024, 1024))


if __name__ == "__main__":
  absltest.main()
