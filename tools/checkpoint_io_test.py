"""The restore MaxText does on the hardware (sharded on fsdp over a platform's devices, Orbax v0 and v1), on four
CPU devices so that leaves really are cut; and the validator's check of it, which must catch a wrong restore."""

import os
import subprocess
import sys
import tempfile
from typing import Any
from unittest import mock

import jax

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 4)  # fsdp=4: a leaf of 64 rows restores as four shards of 16.

from absl.testing import absltest  # pylint: disable=g-import-not-at-top,g-bad-import-order
from absl.testing import parameterized  # pylint: disable=g-import-not-at-top,g-bad-import-order
import numpy as np  # pylint: disable=g-import-not-at-top,g-bad-import-order

import converter  # pylint: disable=g-import-not-at-top
from converter.layout import chunking  # pylint: disable=g-import-not-at-top
from tools import checkpoint_io, validate_lib  # pylint: disable=g-import-not-at-top

P = jax.sharding.PartitionSpec
REPO = os.path.dirname(os.path.dirname(converter.__file__))
BUNDLED = os.path.join(REPO, "testdata", "tiny-qwen3")  # hidden 64, vocab 257, 4 layers.
NORM = ("params", "params", "decoder", "decoder_norm", "scale")


def _convert(devices: int) -> str:
  out = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
  result = subprocess.run(
      [sys.executable, os.path.join(REPO, "converter", "main.py"), f"--hf_model_path={BUNDLED}",
       f"--output_dir={out}", f"--simulated_cpu_devices_count={devices}"],
      capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO), check=False,
  )
  if result.returncode != 0:
    raise AssertionError(result.stderr[-3000:])
  return os.path.join(out, "0", "items")


def _leaf(tree: Any, path: tuple[str, ...]) -> Any:
  for key in path:
    tree = tree[key]
  return tree


def _replaced(tree: Any, path: tuple[str, ...], value: Any) -> Any:
  """`tree` with the leaf at `path` replaced by `value` (a copy of the dicts along the way)."""
  if not path:
    return value
  return {**tree, path[0]: _replaced(tree[path[0]], path[1:], value)}


class CheckpointIoTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Written at 1 device (np.ndarray leaves in _METADATA) and at 16 (jax.Array leaves): both restore sharded.
    cls.items = {devices: _convert(devices) for devices in (1, 16)}
    cls.mesh = checkpoint_io.restore_mesh()

  def test_mesh_is_every_device_on_fsdp(self):
    self.assertEqual(self.mesh.axis_names, chunking.MESH_AXES)
    self.assertEqual({axis: size for axis, size in self.mesh.shape.items() if size > 1}, {"fsdp": 4})
    self.assertEqual(set(self.mesh.devices.flat), set(jax.local_devices(backend="cpu")))

  def test_partition_spec(self):
    self.assertEqual(checkpoint_io.partition_spec((257, 64), ("vocab", "embed_vocab"), self.mesh), P(None, "fsdp"))
    self.assertEqual(checkpoint_io.partition_spec((64, 257), ("embed_vocab", "vocab"), self.mesh), P("fsdp", None))
    # 257 rows cannot be cut in four: replicated, as every axis whose rule names only size-1 mesh axes.
    self.assertEqual(checkpoint_io.partition_spec((257, 64), ("embed_vocab", "vocab"), self.mesh), P(None, None))
    self.assertEqual(checkpoint_io.partition_spec((64, 4, 128), ("embed", "layers", "mlp"), self.mesh),
                     P("fsdp", None, None))
    self.assertEqual(checkpoint_io.partition_spec((64, 4), None, self.mesh), P(None, None))
    with self.assertRaisesRegex(ValueError, "2 logical axes"):
      checkpoint_io.partition_spec((64,), ("embed", "mlp"), self.mesh)

  @parameterized.parameters(1, 16)
  def test_sharded_restores_equal_the_numpy_restore(self, devices):
    items = self.items[devices]
    abstract = checkpoint_io.sharded_abstract_tree(items, self.mesh)
    expected = checkpoint_io.restore_v0(items)
    for api, restore in (("v0", checkpoint_io.restore_v0_sharded), ("v1", checkpoint_io.restore_v1_sharded)):
      with self.subTest(api=api):
        restored = restore(items, abstract)
        params = restored["params"]["params"]
        embedding = params["token_embedder"]["embedding"]
        self.assertIsInstance(embedding, jax.Array)
        self.assertEqual(embedding.sharding.spec, P(None, "fsdp"))
        self.assertEqual({s.data.shape for s in embedding.addressable_shards}, {(257, 16)})
        self.assertEqual(embedding.devices(), set(jax.local_devices(backend="cpu")))
        self.assertEqual(params["decoder"]["logits_dense"]["kernel"].sharding.spec, P("fsdp", None))
        self.assertEqual(params["decoder"]["layers"]["self_attention"]["query"]["kernel"].sharding.spec,
                         P("fsdp", None, None, None))
        self.assertEqual(params["decoder"]["decoder_norm"]["scale"].sharding.spec, P(None))  # norm: tensor=1.
        self.assertEqual(checkpoint_io.trees_bit_identical(restored, expected), [])
        self.assertEqual(validate_lib.device_restore_check(api, restored, abstract, expected, "cpu"), [])

  def test_check_names_each_wrong_leaf(self):
    items = self.items[1]
    abstract = checkpoint_io.sharded_abstract_tree(items, self.mesh)
    expected = checkpoint_io.restore_v0(items)
    restored = checkpoint_io.restore_v0_sharded(items, abstract)
    embedding = ("params", "params", "token_embedder", "embedding")
    kernel = ("params", "params", "decoder", "logits_dense", "kernel")
    wrong = _replaced(restored, embedding, jax.device_put(_leaf(restored, embedding), jax.devices()[0]))
    wrong = _replaced(wrong, kernel, np.asarray(_leaf(restored, kernel)))
    failed = validate_lib.device_restore_check("v0", wrong, abstract, expected, "cpu")
    self.assertLen(failed, 2, failed)
    self.assertIn("not a jax.Array: ['params']['params']['decoder']['logits_dense']['kernel']", failed[0])
    self.assertIn("sharded otherwise than asked: ['params']['params']['token_embedder']['embedding']", failed[1])

  def test_validator_fails_a_restore_whose_values_differ(self):
    items = self.items[16]
    ids = validate_lib.token_ids(257, 2, 32, 0)
    reference = validate_lib.reference_logits(BUNDLED, ids, "bfloat16")
    self.assertEqual(validate_lib.validate(BUNDLED, items, reference=reference).failures(validate_lib.Thresholds()),
                     [])
    sharded = checkpoint_io.restore_v1_sharded

    def one_value_off(items_path: str, abstract: Any) -> Any:  # One bit of one element, its sharding kept.
      tree = sharded(items_path, abstract)
      norm = _leaf(tree, NORM)
      bits = np.asarray(norm).copy().view(np.uint16)
      bits[0] ^= 1
      return _replaced(tree, NORM, jax.device_put(bits.view(norm.dtype), norm.sharding))

    with mock.patch.object(checkpoint_io, "restore_v1_sharded", one_value_off):
      report = validate_lib.validate(BUNDLED, items, reference=reference)
    self.assertEqual(report.failures(validate_lib.Thresholds()),
                     ["v1 restore onto the cpu differs from the CPU restore:"
                      " ['params']['params']['decoder']['decoder_norm']['scale']"])


class SavedItemsTest(absltest.TestCase):

  def test_the_one_saved_checkpointable_is_found_and_two_are_refused(self):
    step = self.create_tempdir().full_path
    os.makedirs(os.path.join(step, "pytree"))
    open(os.path.join(step, "pytree", "_METADATA"), "w").close()
    os.makedirs(os.path.join(step, "not_saved"))
    self.assertEqual(checkpoint_io.saved_items(step), os.path.join(step, "pytree"))
    os.makedirs(os.path.join(step, "second"))
    open(os.path.join(step, "second", "_METADATA"), "w").close()
    with self.assertRaisesRegex(RuntimeError, "expected one saved checkpointable"):
      checkpoint_io.saved_items(step)


if __name__ == "__main__":
  absltest.main()
