"""verify_checkpoint on a tiny Qwen3 conversion: a correct checkpoint verifies clean, block for block and byte for
byte; one flipped bit in one stored block, a wrong dtype, or a missing leaf is reported naming the leaf."""

import glob
import os
import tempfile

import jax

jax.config.update("jax_platforms", "cpu")

import numpy as np  # pylint: disable=g-import-not-at-top,g-bad-import-order
import orbax.checkpoint as ocp
from absl.testing import absltest

from converter import families  # pylint: disable=g-import-not-at-top
from converter.planning import plan
from converter.model_config import load_model_config
from converter.options import PlanOptions
from converter.sources import open_source
from converter.verify import verify_checkpoint
from handlers import ITEMS, LazyTensor, Processes, WriteOptions, lazy_tensor_context
from tools.make_tiny_checkpoint import write_tiny_qwen3

_EMBEDDING = "token_embedder/embedding"


def _tmpdir() -> str:
  return tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))


def _plan(model_dir: str, **options) -> plan.Plan:
  config = load_model_config(model_dir)
  return plan.build_plan(open_source(model_dir, config.raw, config.path), families.resolve(config),
                         PlanOptions(**{"save_dtype": "float32", **options}))


def _save(the_plan: plan.Plan, compression: bool = True, checksums: bool = True) -> str:
  """The plan's leaves saved through our handlers (what a conversion writes); the items path."""
  out = _tmpdir()
  tree = the_plan.tree(lambda leaf: LazyTensor(leaf.name, leaf.shape, leaf.dtype, leaf.loader))
  options = WriteOptions(compression=compression, checksums=checksums)
  checkpointer = ocp.v1.training.Checkpointer(out, context=lazy_tensor_context(options))
  checkpointer.save_checkpointables(0, {ITEMS: tree})
  checkpointer.close()
  return os.path.join(out, "0", ITEMS)


class VerifyTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model_dir = _tmpdir()
    write_tiny_qwen3(cls.model_dir)
    cls.plan = _plan(cls.model_dir)
    cls.items = _save(cls.plan)

  def test_a_correct_checkpoint_verifies_clean(self):
    verified = []
    report = verify_checkpoint(self.plan, self.items, on_block=verified.append)
    self.assertEqual(report.mismatches, ())
    self.assertEqual((report.leaves, report.bytes), (len(self.plan.leaves), self.plan.total_bytes))
    self.assertGreaterEqual(report.blocks, len(self.plan.leaves))
    self.assertEqual((len(verified), sum(verified)), (report.blocks, self.plan.total_bytes))

  def test_processes_verify_disjoint_shares_of_the_blocks(self):
    whole = verify_checkpoint(self.plan, self.items)
    shares = [verify_checkpoint(self.plan, self.items, processes=Processes(index=i, count=2)) for i in range(2)]
    self.assertEqual([s.mismatches for s in shares], [(), ()])
    self.assertEqual(sum(s.blocks for s in shares), whole.blocks)
    self.assertEqual(sum(s.bytes for s in shares), self.plan.total_bytes)
    self.assertTrue(all(s.bytes for s in shares))  # Both have work: the blocks are balanced by bytes.

  def _flip_embedding_bit(self, items: str, row: int, column: int) -> None:
    """Uncompressed, the embedding (one block) lies in a data file as its raw bytes: flips one bit there."""
    leaf = next(leaf for leaf in self.plan.leaves if leaf.name == _EMBEDDING)
    stored = np.asarray(leaf.loader(), leaf.dtype)
    flipped = 0
    for path in glob.glob(os.path.join(items, "**", "d", "*"), recursive=True):
      with open(path, "rb") as f:
        data = bytearray(f.read())
      at = data.find(stored[row].tobytes())  # The row, wherever the inner chunks put it.
      if at >= 0:
        data[at + column * leaf.dtype.itemsize] ^= 0x01
        with open(path, "wb") as f:
          f.write(bytes(data))
        flipped += 1
    self.assertGreaterEqual(flipped, 1)

  def test_a_flipped_bit_in_an_unchecksummed_block_is_reported_naming_the_leaf(self):
    items = _save(self.plan, compression=False, checksums=False)  # As versions before checksums wrote them.
    row, column = 100, 7
    self._flip_embedding_bit(items, row, column)
    report = verify_checkpoint(self.plan, items)
    (mismatch,) = report.mismatches
    self.assertStartsWith(mismatch, f"{_EMBEDDING} (from model.embed_tokens.weight) block at (0, 0)")
    self.assertEndsWith(mismatch, f": 1 differing values, first at ({row}, {column})")

  def test_a_chunk_failing_its_checksum_is_reported_naming_the_leaf_and_the_chunk(self):
    items = _save(self.plan, compression=False)
    self._flip_embedding_bit(items, 100, 7)
    report = verify_checkpoint(self.plan, items)
    (mismatch,) = report.mismatches
    self.assertStartsWith(mismatch, f"{_EMBEDDING} (from model.embed_tokens.weight) block at (0, 0): damaged")
    self.assertIn("DATA_LOSS", mismatch)
    # tensorstore names the damaged inner chunk: its index in the write block's grid, and the block's key.
    self.assertRegex(mismatch, r'shard entry \{\d+, 0\}/\{\d+, 1\} in'
                               r' "params\.params\.token_embedder\.embedding/c/0/0"')

  def test_a_leaf_stored_in_another_dtype_is_reported(self):
    bf16_plan = _plan(self.model_dir, save_dtype="bfloat16")
    report = verify_checkpoint(bf16_plan, self.items)
    self.assertLen(report.mismatches, len(bf16_plan.leaves))
    embedding = next(leaf for leaf in bf16_plan.leaves if leaf.name == _EMBEDDING)
    self.assertIn(f"{_EMBEDDING}: stored {embedding.shape} float32, expected {embedding.shape} bfloat16",
                  report.mismatches)
    self.assertEqual(report.blocks, 0)

  def test_a_leaf_missing_from_the_checkpoint_is_reported(self):
    # An unscanned plan's per-layer leaves (decoder/layers_0/...) are not in a scanned checkpoint.
    unscanned = _plan(self.model_dir, scan_layers=False)
    report = verify_checkpoint(unscanned, self.items)
    missing = [m for m in report.mismatches if m.endswith(": missing from the checkpoint")]
    self.assertIn("decoder/layers_0/mlp/wi_0/kernel: missing from the checkpoint", missing)
    per_layer = [leaf for leaf in unscanned.leaves if leaf.path[1].startswith("layers_")]
    self.assertLen(missing, len(per_layer))
    self.assertLen(report.mismatches, len(per_layer))  # The top-level leaves are the same and verify clean.


if __name__ == "__main__":
  absltest.main()
