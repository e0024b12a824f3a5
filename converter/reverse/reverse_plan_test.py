"""The MaxText -> HF plan, checked against the forward plan of the same tiny models: every HF tensor comes back
with its name, shape and values (its parts, read from the leaves the forward direction wrote, undone and joined),
and a checkpoint that does not match the config is refused naming the leaf.

No Orbax checkpoint is written: the reverse plan needs only the leaves' metadata, so a stand-in reader lists the
forward plan's leaves, and the parts are applied to the forward plan's own leaf values."""

import json
import os
import tempfile
from typing import Any
from unittest import mock

import numpy as np
from absl.testing import absltest, parameterized

from converter import families
from converter.reverse import reverse_plan
from converter.planning import plan
from converter.sources.checkpoint_reader import StoredArray
from converter.errors import ConversionError
from converter.model_config import load_model_config
from converter.options import PlanOptions
from converter.sources import open_source
from tools.testing import tiny_models
from tools.checkpoint_io import read_safetensors_dir
from tools.make_tiny_checkpoint import TINY_QWEN3_CONFIG, write_tiny_qwen3

PARAMS = ("params", "params")


def _tmpdir() -> str:
  return tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))


class _Reader:
  """What the reverse plan reads of a checkpoint: its arrays' metadata."""

  def __init__(self, arrays: dict[tuple[str, ...], np.ndarray]):
    self.arrays = {key: StoredArray(key, ".".join(key), value.shape, value.dtype) for key, value in arrays.items()}


def _forward_leaves(model_dir: str, **options) -> tuple[plan.Plan, dict[tuple[str, ...], np.ndarray]]:
  """The forward plan of `model_dir` and every leaf's value, keyed as the checkpoint stores them."""
  config = load_model_config(model_dir)
  the_plan = plan.build_plan(open_source(model_dir, config.raw, config.path), families.resolve(config),
                             PlanOptions(**{"save_dtype": "float32", **options}))
  return the_plan, {PARAMS + leaf.path: np.asarray(leaf.loader(), leaf.dtype) for leaf in the_plan.leaves}


def _checkpoint_dir(custom_metadata: dict[str, Any] | None) -> str:
  """OUT/0 with items/_METADATA and, unless None, the step's _CHECKPOINT_METADATA recording `custom_metadata`."""
  step = os.path.join(_tmpdir(), "0")
  os.makedirs(os.path.join(step, "items"))
  with open(os.path.join(step, "items", "_METADATA"), "w") as f:
    f.write("{}")
  if custom_metadata is not None:
    with open(os.path.join(step, "_CHECKPOINT_METADATA"), "w") as f:
      json.dump({"custom_metadata": custom_metadata}, f)
  return step


def _record(hf_config: dict, family: str, scan_layers: bool) -> dict[str, Any]:
  return {"scan_layers": scan_layers, "hf2maxtext": {"family": family, "hf_config": hf_config}}


def _assemble(tensor: reverse_plan.HfTensor, leaves: dict[tuple[str, ...], np.ndarray]) -> np.ndarray:
  """The HF tensor from its parts: each part's ops applied to its slice of the leaf; the parts of a fused tensor
  placed in their slots; pieces laid end to end along the first axis."""
  pieces = []
  for parts in tensor.pieces:
    values = []
    for part in parts:
      value = leaves[part.leaf][part.index]
      for op in part.ops:
        value = op(value)
      values.append(value)
    if len(parts) == 1 and parts[0].split is None:
      piece = values[0]
    else:
      piece = np.zeros(tensor.piece_shape, tensor.dtype)
      for part, value in zip(parts, values):
        part.split.place(piece, value)
    pieces.append(np.asarray(piece).reshape((-1,) + tensor.shape[1:]))
  return np.concatenate(pieces).reshape(tensor.shape)


class ReversePlanTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.qwen3_dir = _tmpdir()
    write_tiny_qwen3(cls.qwen3_dir)
    cls.qwen3_tensors = read_safetensors_dir(cls.qwen3_dir)
    # Experts in one HF tensor, a fused gate/up projection split into two leaves, biases: GPT-OSS.
    cls.gpt_oss_dir = tiny_models.build_tiny_model("gpt_oss", _tmpdir())
    cls.gpt_oss_tensors = read_safetensors_dir(cls.gpt_oss_dir)

  def reverse(self, leaves, custom_metadata, **kwargs) -> reverse_plan.ReversePlan:
    return reverse_plan.plan_to_huggingface(_checkpoint_dir(custom_metadata), reader=_Reader(leaves), **kwargs)

  def check_round_trip(self, model_dir: str, hf_tensors: dict[str, np.ndarray], family: str,
                       scan_layers: bool) -> reverse_plan.ReversePlan:
    """The reverse plan gives back every HF tensor (name, shape, values) from the forward plan's leaves."""
    forward, leaves = _forward_leaves(model_dir, scan_layers=scan_layers)
    hf_config = load_model_config(model_dir).raw
    the_plan = self.reverse(leaves, _record(dict(hf_config), family, scan_layers))
    self.assertEqual((the_plan.family.name, the_plan.scan_layers, the_plan.target_model),
                     (family, scan_layers, forward.target_model))
    self.assertEqual(sorted(t.name for t in the_plan.tensors), sorted(hf_tensors))
    for tensor in the_plan.tensors:
      expected = hf_tensors[tensor.name].astype(np.float32)
      self.assertEqual((tensor.shape, tensor.dtype), (expected.shape, np.dtype(np.float32)), tensor.name)
      got = _assemble(tensor, leaves)
      if tensor.exact:
        np.testing.assert_array_equal(got, expected, err_msg=tensor.name)
      else:  # Undone in float arithmetic: within one unit in the last place.
        np.testing.assert_allclose(got, expected, rtol=2 ** -23, atol=0, err_msg=tensor.name)
    self.assertEqual(the_plan.total_bytes, sum(v.size * 4 for v in hf_tensors.values()))
    return the_plan

  @parameterized.parameters(True, False)
  def test_qwen3_comes_back_tensor_for_tensor(self, scan_layers):
    the_plan = self.check_round_trip(self.qwen3_dir, self.qwen3_tensors, "qwen3", scan_layers)
    self.assertEqual(the_plan.warnings, ())

  def test_large_tensors_come_back_a_run_of_rows_at_a_time(self):
    # Above the row-block threshold a 2-D tensor is read in slabs of rows instead of whole.
    with mock.patch.object(reverse_plan, "ROW_BLOCK_BYTES", 4096):
      the_plan = self.check_round_trip(self.qwen3_dir, self.qwen3_tensors, "qwen3", True)
    embedding = next(t for t in the_plan.tensors if t.name == "model.embed_tokens.weight")
    self.assertTrue(embedding.in_pieces)
    rows = [part.index for (part,) in embedding.pieces]
    self.assertGreater(len(rows), 2)
    self.assertEqual(sum(r[0].stop - r[0].start for r in rows), 257)

  def test_experts_and_fused_projections_come_back(self):
    the_plan = self.check_round_trip(self.gpt_oss_dir, self.gpt_oss_tensors, "gpt_oss", True)
    gate_up = next(t for t in the_plan.tensors if t.name == "model.layers.0.mlp.experts.gate_up_proj")
    self.assertTrue(gate_up.in_pieces)
    self.assertLen(gate_up.pieces, 4)  # One piece per expert, each joined from the gate and the up leaf.
    self.assertEqual([len(parts) for parts in gate_up.pieces], [2] * 4)

  @parameterized.named_parameters(("whole", 16 << 20), ("in_runs_of_rows", 4096))
  def test_padded_vocabulary_rows_are_dropped_with_a_warning(self, row_block_bytes):
    _, leaves = _forward_leaves(self.qwen3_dir, scan_layers=True, target_vocab_size=300)
    with mock.patch.object(reverse_plan, "ROW_BLOCK_BYTES", row_block_bytes):
      # In runs of 16 rows, the run of rows 256..271 holds one row of the vocabulary and 15 of padding.
      the_plan = self.reverse(leaves, _record(TINY_QWEN3_CONFIG, "qwen3", True))
    self.assertIn("vocabulary padded to 300 in MaxText: rows 257.. are dropped", the_plan.warnings)
    embedding = next(t for t in the_plan.tensors if t.name == "model.embed_tokens.weight")
    np.testing.assert_array_equal(_assemble(embedding, leaves),
                                  self.qwen3_tensors["model.embed_tokens.weight"].astype(np.float32))

  def test_an_unrecorded_layout_is_inferred_from_the_tree(self):
    _, leaves = _forward_leaves(self.qwen3_dir, scan_layers=False)
    config_path = os.path.join(self.qwen3_dir, "config.json")
    the_plan = self.reverse(leaves, None, hf_config_path=config_path)  # A checkpoint MaxText wrote itself.
    self.assertFalse(the_plan.scan_layers)
    self.assertIn("no scan_layers in the checkpoint metadata; unscanned layers found in the tree", the_plan.warnings)
    self.assertEqual(the_plan.family.name, "qwen3")
    # DeepSeek stacks its layers in dense_layers / moe_layers, not decoder/layers.
    deepseek = tiny_models.build_tiny_model("deepseek3", _tmpdir())
    _, leaves = _forward_leaves(deepseek, scan_layers=True)
    the_plan = self.reverse(leaves, None, hf_config_path=os.path.join(deepseek, "config.json"))
    self.assertTrue(the_plan.scan_layers)

  def test_a_family_flag_overriding_the_record_is_warned_about(self):
    _, leaves = _forward_leaves(self.qwen3_dir, scan_layers=True)
    the_plan = self.reverse(leaves, _record(TINY_QWEN3_CONFIG, "qwen3", True), family="qwen3")
    self.assertEqual(the_plan.warnings, ())
    record = _record(TINY_QWEN3_CONFIG, "llama", True)
    with self.assertRaises(ConversionError):  # The recorded family does not fit Qwen3's config.
      self.reverse(leaves, record)
    the_plan = self.reverse(leaves, record, family="qwen3")
    self.assertIn("--family=qwen3 overrides the checkpoint's recorded family 'llama'", the_plan.warnings)

  def test_no_recorded_config_asks_for_hf_config_path(self):
    _, leaves = _forward_leaves(self.qwen3_dir, scan_layers=True)
    with self.assertRaisesRegex(ConversionError, "pass --hf_config_path="):
      self.reverse(leaves, {"scan_layers": True})

  def test_a_missing_leaf_is_named(self):
    _, leaves = _forward_leaves(self.qwen3_dir, scan_layers=True)
    del leaves[PARAMS + ("decoder", "layers", "mlp", "wo", "kernel")]
    with self.assertRaisesRegex(ConversionError, "leaf params/params/decoder/layers/mlp/wo/kernel is missing"):
      self.reverse(leaves, _record(TINY_QWEN3_CONFIG, "qwen3", True))

  def test_a_leaf_of_the_wrong_shape_is_named(self):
    _, leaves = _forward_leaves(self.qwen3_dir, scan_layers=True)
    key = PARAMS + ("decoder", "decoder_norm", "scale")
    leaves[key] = np.zeros((65,), np.float32)
    with self.assertRaisesRegex(ConversionError, r"leaf params/params/decoder/decoder_norm/scale has shape \(65,\),"
                                                 r" but .* implies \(64,\)"):
      self.reverse(leaves, _record(TINY_QWEN3_CONFIG, "qwen3", True))

  def test_a_leaf_that_is_not_a_float_is_refused(self):
    _, leaves = _forward_leaves(self.qwen3_dir, scan_layers=True)
    key = PARAMS + ("decoder", "decoder_norm", "scale")
    leaves[key] = leaves[key].astype(np.int32)
    with self.assertRaisesRegex(ConversionError, "decoder_norm/scale has dtype int32, not a float"):
      self.reverse(leaves, _record(TINY_QWEN3_CONFIG, "qwen3", True))

  def test_a_leaf_in_another_dtype_than_the_recorded_one_is_refused(self):
    _, leaves = _forward_leaves(self.qwen3_dir, scan_layers=True)
    key = PARAMS + ("decoder", "decoder_norm", "scale")
    leaves[key] = leaves[key].astype(np.float16)  # Same width as bfloat16: the bytes would decode as other values.
    record = _record(TINY_QWEN3_CONFIG, "qwen3", True)
    record["hf2maxtext"]["save_dtype"] = "bfloat16"
    with self.assertRaisesRegex(ConversionError, "decoder_norm/scale is stored as float16 .* records the checkpoint"
                                                 " as saved in bfloat16"):
      self.reverse(leaves, record)

  def test_an_unknown_recorded_family_names_the_record(self):
    _, leaves = _forward_leaves(self.qwen3_dir, scan_layers=True)
    with self.assertRaisesRegex(ConversionError, r"_CHECKPOINT_METADATA \(custom_metadata.hf2maxtext.family\): unknown"
                                                 r" family 'qwen9'"):
      self.reverse(leaves, _record(TINY_QWEN3_CONFIG, "qwen9", True))

  def test_leaves_the_family_does_not_use_are_refused(self):
    _, leaves = _forward_leaves(self.qwen3_dir, scan_layers=True)
    leaves[PARAMS + ("decoder", "extra", "kernel")] = np.zeros((2, 2), np.float32)
    with self.assertRaisesRegex(ConversionError, "1 leaf/leaves under params/params that qwen3 .* does not use:"
                                                 " decoder/extra/kernel"):
      self.reverse(leaves, _record(TINY_QWEN3_CONFIG, "qwen3", True))

  def test_scanned_and_unscanned_leaves_do_not_mix(self):
    # An unscanned checkpoint recorded as scanned: the stacked leaves are missing.
    _, leaves = _forward_leaves(self.qwen3_dir, scan_layers=False)
    with self.assertRaisesRegex(ConversionError, r"leaf params/params/decoder/layers/.* is missing; qwen3 .*scanned"):
      self.reverse(leaves, _record(TINY_QWEN3_CONFIG, "qwen3", True))

  @parameterized.named_parameters(("sft", (), True), ("rl_adapter_unscanned", ("base",), False))
  def test_a_tunix_nnx_state_comes_back_tensor_for_tensor(self, prefix, scan_layers):
    # Tunix's CheckpointManager saves nnx.state(model): every Variable a `.../value` leaf, RngState streams among
    # the weights, `base/` first where MaxText's TunixMaxTextAdapter wraps the model (RL), an nnx.List `layers/0`.
    _, leaves = _forward_leaves(self.qwen3_dir, scan_layers=scan_layers)
    nnx_leaves = {}
    for keys, value in leaves.items():
      path = tuple(part for key in keys[len(PARAMS):] for part in
                   (key.split("_") if key.startswith("layers_") else (key,)))
      nnx_leaves[prefix + path + ("value",)] = value
    for stream in ("dropout", "params"):
      nnx_leaves[prefix + ("decoder", "rngs", stream, "key", "value")] = np.zeros((2,), np.uint32)
      nnx_leaves[prefix + ("decoder", "rngs", stream, "count", "value")] = np.zeros((), np.uint32)
    the_plan = reverse_plan.plan_to_huggingface(_checkpoint_dir({}), reader=_Reader(nnx_leaves),
                                                hf_config_path=os.path.join(self.qwen3_dir, "config.json"))
    self.assertEqual((the_plan.family.name, the_plan.scan_layers), ("qwen3", scan_layers))
    self.assertEqual(sorted(t.name for t in the_plan.tensors), sorted(self.qwen3_tensors))
    for tensor in the_plan.tensors:
      self.assertTrue(all(part.leaf[:len(prefix)] == prefix and part.leaf[-1] == "value"
                          for parts in tensor.pieces for part in parts), tensor.name)
      np.testing.assert_allclose(_assemble(tensor, nnx_leaves), self.qwen3_tensors[tensor.name].astype(np.float32),
                                 rtol=2 ** -23, atol=0, err_msg=tensor.name)

  def test_an_nnx_state_missing_a_weight_names_its_own_leaf(self):
    _, leaves = _forward_leaves(self.qwen3_dir, scan_layers=True)
    nnx_leaves = {keys[len(PARAMS):] + ("value",): v for keys, v in leaves.items()
                  if keys != PARAMS + ("decoder", "layers", "mlp", "wo", "kernel")}
    with self.assertRaisesRegex(ConversionError, "leaf decoder/layers/mlp/wo/kernel/value is missing"):
      self.reverse(nnx_leaves, _record(TINY_QWEN3_CONFIG, "qwen3", True))

  def test_an_nnx_state_of_lora_factors_only_is_refused(self):
    leaves = {("decoder", "layers", "mlp", "wo", "kernel_lora_a", "value"): np.zeros((128, 8), np.float32),
              ("decoder", "layers", "mlp", "wo", "kernel_lora_b", "value"): np.zeros((8, 64), np.float32)}
    with self.assertRaisesRegex(ConversionError, "LoRA factors only .* --lora_checkpoint_path"):
      self.reverse(leaves, _record(TINY_QWEN3_CONFIG, "qwen3", True))

  def test_a_tree_of_neither_kind_is_named(self):
    leaves = {("opt_state", "mu", "kernel"): np.zeros((2, 2), np.float32),
              ("step",): np.zeros((1,), np.int32)}
    with self.assertRaisesRegex(ConversionError, r"neither a MaxText TrainState \(arrays under params/params\) nor"
                                                 r" an NNX state as Tunix saves it .* under: opt_state, step"):
      self.reverse(leaves, _record(TINY_QWEN3_CONFIG, "qwen3", True))


if __name__ == "__main__":
  absltest.main()
