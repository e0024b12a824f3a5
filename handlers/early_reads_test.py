"""Early reads: the writer's first blocks in its order, up to the budget, each taken once with the values a read
returns; no more once the writer has taken one; a failed read raised where its block is taken."""

import threading

import numpy as np
from absl.testing import absltest

from handlers.blocks import block_target_bytes, plan_blocks
from handlers.early_reads import EarlyReads
from handlers.lazy_tensor import LazyTensor, LazyTensorLoadError

ROWS = 2  # Rows of a natural block: 2 x 4 float32 = 32 bytes.
BLOCK_BYTES = ROWS * 4 * 4
BUDGET = 4 * BLOCK_BYTES  # Blocks of one natural block each (block_target_bytes: a quarter of the budget).


class Rows:
  """A region loader of random rows that records the regions read; `gate` (when given) holds the first read."""

  def __init__(self, rows: int, seed: int, reads: list, gate: threading.Event | None = None,
               fail_at: int | None = None):
    self.values = np.random.default_rng(seed).standard_normal((rows, 4)).astype(np.float32)
    self.block_shape = (ROWS, 4)
    self._reads, self._gate, self._fail_at = reads, gate, fail_at

  def region(self, index):
    if self._gate is not None:
      self._gate.wait(10)
    self._reads.append(index[0].start)
    if index[0].start == self._fail_at:
      raise OSError("disk went away")
    return self.values[index]


def _tensors(reads, **kwargs):
  return [LazyTensor("a", (6, 4), np.float32, Rows(6, 0, reads, **kwargs)),
          LazyTensor("b", (8, 4), np.float32, Rows(8, 1, reads))]  # Larger: written after `a`.


def _writer_order(values, budget):
  _, located, _ = plan_blocks(values, block_target_bytes(budget))
  return [(values[leaf], index) for leaf, index in located]


class EarlyReadsTest(absltest.TestCase):

  def test_reads_the_writers_first_blocks_up_to_the_budget(self):
    reads = []
    values = _tensors(reads)
    early = EarlyReads(values, BUDGET)
    self.assertTrue(early.join(10))
    order = _writer_order(values, BUDGET)
    self.assertLen(order, 7)  # Three blocks of `a` and the first of `b` fit the budget; the second of `b` not.
    self.assertEqual(early.read_bytes, BUDGET)
    for lazy, index in order[:4]:
      np.testing.assert_array_equal(early.take(lazy.name, index).result(), lazy.loader.values[index])
    last_lazy, last = order[4]
    self.assertIsNone(early.take(last_lazy.name, last))
    self.assertEqual(early.taken_bytes, BUDGET)
    self.assertEqual(reads, [0, 2, 4, 0])  # Nothing read twice, the blocks in the writer's order.

  def test_no_block_is_read_early_once_the_writer_took_one(self):
    reads, gate = [], threading.Event()
    values = _tensors(reads, gate=gate)
    early = EarlyReads(values, BUDGET)
    (first_lazy, first), (second_lazy, second) = _writer_order(values, BUDGET)[:2]
    self.assertIsNone(early.take(second_lazy.name, second))  # Not read yet: the writer reads it itself.
    gate.set()
    self.assertTrue(early.join(10))
    self.assertEqual(reads, [0])  # The read under way when the writer started, and none after it.
    np.testing.assert_array_equal(early.take(first_lazy.name, first).result(), first_lazy.loader.values[first])

  def test_a_failed_read_is_raised_where_its_block_is_taken_naming_the_tensor(self):
    reads = []
    values = _tensors(reads, fail_at=2)
    early = EarlyReads(values, BUDGET)
    self.assertTrue(early.join(10))
    self.assertEqual(reads, [0, 2])  # No more reads after the failure.
    (lazy, index) = _writer_order(values, BUDGET)[1]
    with self.assertRaisesRegex(LazyTensorLoadError, "'a'.*OSError: disk went away"):
      early.take(lazy.name, index).result()

  def test_close_drops_the_blocks_nobody_took(self):
    values = _tensors([])
    early = EarlyReads(values, BUDGET)
    self.assertTrue(early.join(10))
    early.close()
    lazy, index = _writer_order(values, BUDGET)[0]
    self.assertIsNone(early.take(lazy.name, index))
    self.assertEqual(early.taken_bytes, 0)


if __name__ == "__main__":
  absltest.main()
