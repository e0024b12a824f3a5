"""Shares of a save's blocks: disjoint, contiguous, balanced, and the same in every process."""

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

  def test_every_process_gets_work_when_blocks_are_equal(self):
    self.assertEqual(shares.owners([10] * 8, 4), [0, 0, 1, 1, 2, 2, 3, 3])

  def test_one_process_and_empty_saves(self):
    self.assertEqual(shares.owners([5, 6], 1), [0, 0])
    self.assertEqual(shares.owners([], 3), [])
    self.assertEqual(shares.owners([0, 0], 2), [0, 0])


if __name__ == "__main__":
  absltest.main()
