"""Shares of a save's blocks: disjoint, balanced, striped over the plan where there are enough blocks, contiguous
where there are few, and the same in every process."""

import random

from absl.testing import absltest

from handlers import shares


class OwnersTest(absltest.TestCase):

  def test_balanced_contiguous_shares(self):
    sizes = [64, 64, 8, 8, 8, 8, 32, 64, 1, 1, 64, 30]
    for count in (1, 2, 3, 4, 7):
      owners = shares.owners(sizes, count)
      self.assertEqual(owners, sorted(owners))  # Contiguous runs, in order.
      self.assertEqual(set(owners) - set(range(count)), set())
      totals = [sum(b for b, o in zip(sizes, owners) if o == p) for p in range(count)]
      self.assertEqual(sum(totals), sum(sizes))
      for total in totals:  # Within one largest block of the mean.
        self.assertLessEqual(abs(total - sum(sizes) / count), max(sizes))

  def test_many_blocks_are_striped_so_each_share_mixes_the_whole_plan(self):
    # A plan's first half one kind of leaf (say expert matrices), its second half another (embedding, logits).
    rng = random.Random(0)
    sizes = [rng.randint(1, 64) for _ in range(400)]
    half = sum(sizes) / 2
    kinds, start = [], 0
    for nbytes in sizes:
      kinds.append(start + nbytes / 2 < half)
      start += nbytes
    for count in (2, 3, 4, 7):
      stripes = shares.stripes_per_process(len(sizes), count)
      self.assertEqual(stripes, shares.STRIPES_PER_PROCESS)
      owners = shares.owners(sizes, count)
      runs = 1 + sum(a != b for a, b in zip(owners, owners[1:]))
      self.assertEqual(runs, count * stripes)  # Each process reads `stripes` stretches, in turn.
      for process in range(count):
        mine = [(b, first) for b, first, o in zip(sizes, kinds, owners) if o == process]
        total = sum(b for b, _ in mine)
        self.assertLessEqual(abs(total - sum(sizes) / count), stripes * max(sizes))
        first_half = sum(b for b, first in mine if first)
        self.assertLessEqual(abs(first_half / total - 0.5), 0.1, (count, process))  # Contiguous runs: 0 or 1.

  def test_few_blocks_stay_in_contiguous_runs(self):
    self.assertEqual(shares.stripes_per_process(2 * shares.MIN_BLOCKS_PER_STRIPE * 2 - 1, 2), 1)
    owners = shares.owners([3] * 31, 2)
    self.assertEqual(owners, sorted(owners))

  def test_every_process_gets_work_when_blocks_are_equal(self):
    self.assertEqual(shares.owners([10] * 8, 4), [0, 0, 1, 1, 2, 2, 3, 3])

  def test_one_process_and_empty_saves(self):
    self.assertEqual(shares.owners([5, 6], 1), [0, 0])
    self.assertEqual(shares.owners([], 3), [])
    self.assertEqual(shares.owners([0, 0], 2), [0, 0])


if __name__ == "__main__":
  absltest.main()
