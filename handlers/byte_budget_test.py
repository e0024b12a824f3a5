"""ByteBudget: never more than the limit in use, one oversized request at a time, arrival order kept."""

import asyncio

from absl.testing import absltest

from handlers.byte_budget import ByteBudget


class ByteBudgetTest(absltest.TestCase):

  def test_limit_is_never_exceeded_and_order_is_kept(self):
    order = []

    async def worker(budget, name, nbytes, delay):
      await budget.acquire(nbytes)
      order.append(name)
      assert budget.in_use <= budget.limit or budget.in_use == nbytes, budget.in_use
      await asyncio.sleep(delay)
      await budget.release(nbytes)

    async def main():
      budget = ByteBudget(10)
      tasks = []
      for i, (nbytes, delay) in enumerate([(6, 0.02), (6, 0.0), (3, 0.0), (25, 0.01), (1, 0.0)]):
        tasks.append(asyncio.create_task(worker(budget, i, nbytes, delay)))
        await asyncio.sleep(0)
      await asyncio.gather(*tasks)
      return budget

    budget = asyncio.run(main())
    self.assertEqual(order, [0, 1, 2, 3, 4])
    self.assertEqual(budget.in_use, 0)
    self.assertEqual(budget.peak, 25)  # The oversized request ran, alone.

  def test_rejects_non_positive_limit(self):
    with self.assertRaises(ValueError):
      ByteBudget(0)


if __name__ == "__main__":
  absltest.main()
