"""The v1 registration: LazyTensor trees save through `save_checkpointables` and restore as numpy via v0 and v1."""

import functools
import json
import os
import tempfile

import jax

jax.config.update("jax_platforms", "cpu")

import ml_dtypes  # pylint: disable=g-import-not-at-top,g-bad-import-order
import numpy as np
from etils import epath
import orbax.checkpoint as ocp
import tensorstore as ts
from absl.testing import absltest

from handlers import (  # pylint: disable=g-import-not-at-top
    ITEMS, LazyTensor, LazyTensorLeafHandler, ShardedLazyTensor, WriteOptions, build_lazy_tensor_checkpointables_registry, lazy_tensor_context,
)
from handlers import _orbax_private


def _values(seed, shape):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _tree():
  return {
      "step": 0,
      "params": {"params": {
          "a": LazyTensor("a", (16, 8), ml_dtypes.bfloat16, functools.partial(_values, 0, (16, 8))),
          "b": LazyTensor("b", (3, 4, 5), np.float32, functools.partial(_values, 1, (3, 4, 5))),
          "c": LazyTensor("c", (7,), ml_dtypes.bfloat16, functools.partial(_values, 2, (7,))),
      }},
      "opt_state": {},
  }


def _tmpdir():
  return tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))


class RegistryTest(absltest.TestCase):

  def _save(self, max_inflight_bytes):
    out = _tmpdir()
    checkpointer = ocp.v1.training.Checkpointer(
        out, context=lazy_tensor_context(WriteOptions(max_inflight_bytes=max_inflight_bytes))
    )
    checkpointer.save_checkpointables(0, {ITEMS: _tree()}, custom_metadata={"scan_layers": True})
    checkpointer.close()
    return out

  def _expected(self):
    return {k: np.asarray(v) for k, v in _tree()["params"]["params"].items()}

  def test_round_trip_through_v0_and_v1_with_small_budget(self):
    # A budget smaller than any leaf forces one leaf per batch: the batching path must not lose leaves.
    for budget in (1, 1 << 30):
      out = self._save(budget)
      self.assertTrue(os.path.exists(os.path.join(out, "0", "commit_success.txt")))
      items = os.path.join(out, "0", ITEMS)
      v0 = ocp.PyTreeCheckpointer().restore(items)["params"]["params"]
      abstract = jax.tree.map(lambda _: np.ndarray, _tree())
      v1 = ocp.v1.load(os.path.join(out, "0"), abstract, checkpointable_name=ITEMS)["params"]["params"]
      for name, expected in self._expected().items():
        for restored in (v0[name], v1[name]):
          self.assertEqual(restored.dtype, expected.dtype, name)
          self.assertEqual(restored.tobytes(), expected.tobytes(), name)

  def test_metadata_records_numpy_typestr_not_handler_class(self):
    out = self._save(1 << 30)
    with open(os.path.join(out, "0", ITEMS, "_METADATA")) as f:
      types = {k: v["value_metadata"]["value_type"] for k, v in json.load(f)["tree_metadata"].items()}
    self.assertEqual({t for k, t in types.items() if "params" in k}, {"np.ndarray"})

  def test_registry_binds_items_and_keeps_global_handlers(self):
    registry = build_lazy_tensor_checkpointables_registry()
    self.assertTrue(registry.has(ITEMS))
    names = [name for _, name in registry.get_all_entries()]
    self.assertIn("metrics", names)  # From the global registry.

  def test_tree_handler_adds_lazy_tensor_to_a_given_leaf_registry(self):
    leaf_registry = _orbax_private.StandardLeafHandlerRegistry()
    handler_class = build_lazy_tensor_checkpointables_registry().get(ITEMS)
    handler = handler_class(leaf_handler_registry=leaf_registry)
    self.assertIs(_orbax_private.leaf_handler_registry_of(handler), leaf_registry)
    # Orbax's own class, so that the checkpoint records its typestr (stock_restore_test.py says why).
    self.assertIs(type(handler), ocp.v1.handlers.PyTreeHandler)
    self.assertTrue(leaf_registry.is_handleable(LazyTensor))
    self.assertTrue(handler.is_handleable(_tree()))
    self.assertEqual(leaf_registry.get_secondary_typestrs(leaf_registry.get(LazyTensor)), ["np.ndarray"])
    self.assertTrue(issubclass(leaf_registry.get(LazyTensor), LazyTensorLeafHandler))
    self.assertEqual(leaf_registry.get_secondary_typestrs(leaf_registry.get(ShardedLazyTensor)), ["jax.Array"])
    # Plain arrays still have their own handlers beside ours.
    self.assertTrue(leaf_registry.is_handleable(np.ndarray))
    self.assertTrue(leaf_registry.is_handleable(jax.Array))

  def test_context_carries_write_options_without_deprecated_constructor_arguments(self):
    # orbax-checkpoint 0.12.8 logs a deprecation warning when option objects are passed to Context(...).
    with self.assertNoLogs("absl", level="WARNING"):
      compressed = lazy_tensor_context(WriteOptions())
      uncompressed = lazy_tensor_context(WriteOptions(compression=False))
    self.assertTrue(compressed.array.saving.use_compression)
    self.assertFalse(uncompressed.array.saving.use_compression)
    for context in (compressed, uncompressed):
      self.assertTrue(context.checkpointables.registry.has(ITEMS))

  def test_compression_and_checksum_options_reach_the_stored_arrays(self):
    for compression, checksums in ((True, True), (False, True), (True, False)):
      out = _tmpdir()
      context = lazy_tensor_context(WriteOptions(compression=compression, checksums=checksums))
      checkpointer = ocp.v1.training.Checkpointer(out, context=context)
      checkpointer.save_checkpointables(0, {ITEMS: _tree()})
      checkpointer.close()
      v0 = ocp.PyTreeCheckpointer().restore(os.path.join(out, "0", ITEMS))["params"]["params"]
      for name, expected in self._expected().items():
        self.assertEqual(v0[name].tobytes(), expected.tobytes(), name)
      # The array's zarr v3 codecs (not the OCDBT store's own, which are always zstd).
      context = ts.Context({"cache_pool#ocdbt": {}})
      info = ocp.type_handlers.ParamInfo(name="params.params.a", parent_dir=epath.Path(out) / "0" / ITEMS,
                                         is_ocdbt_checkpoint=True, use_zarr3=True, ts_context=context)
      spec = ts.open(ocp.type_handlers.get_json_tspec_read(info, use_ocdbt=True), open=True, context=context)
      codecs = spec.result().spec().to_json()["metadata"]["codecs"][0]["configuration"]["codecs"]
      self.assertEqual([codec["name"] for codec in codecs],
                       ["bytes"] + (["zstd"] if compression else ["crc32c"] if checksums else []), codecs)
      if compression:
        self.assertEqual(codecs[-1]["configuration"].get("checksum", False), checksums, codecs)

  def test_v0_registration_saves_lazy_tensors(self):
    out = os.path.join(_tmpdir(), "v0")
    ocp.PyTreeCheckpointer().save(out, _tree()["params"])
    restored = ocp.PyTreeCheckpointer().restore(out)["params"]
    for name, expected in self._expected().items():
      self.assertEqual(restored[name].tobytes(), expected.tobytes(), name)


if __name__ == "__main__":
  absltest.main()
