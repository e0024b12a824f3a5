"""Claimed shares: each unit of work written by exactly one process, however the processes' progress interleaves;
a process that runs ahead takes over the end of a slower one's share, and nothing is taken that was started."""

import random

from absl.testing import absltest

from handlers import Processes, claims, shares


class _Coordinator:
  """In-memory first-come claims, as the coordinator's key-value store keeps them."""

  def __init__(self):
    self.holders: dict[tuple[str, int, int], int] = {}

  def as_process(self, index: int) -> "_Claimant":
    return _Claimant(self, index)


class _Claimant:

  def __init__(self, coordinator: _Coordinator, index: int):
    self.coordinator, self.index = coordinator, index

  def claim(self, share: str, owner: int, unit: int) -> int:
    return self.coordinator.holders.setdefault((share, owner, unit), self.index)


def _sizes(count: int, seed: int = 0) -> list[int]:
  rng = random.Random(seed)
  return [rng.randint(1, 16) << 20 for _ in range(count)]


class UnitsTest(absltest.TestCase):

  def test_units_cut_each_share_in_order_and_cover_it(self):
    sizes = _sizes(300)
    for count in (1, 2, 3, 5):
      owners = shares.owners(sizes, count)
      by_process = claims.units(sizes, count)
      self.assertLen(by_process, count)
      for process, units in enumerate(by_process):
        numbers = [n for unit in units for n in unit]
        self.assertEqual(numbers, [n for n, o in enumerate(owners) if o == process])
        for unit in units[:-1]:  # Each at least UNIT_BYTES, and no larger than it needs to be.
          self.assertGreaterEqual(sum(sizes[n] for n in unit), claims.UNIT_BYTES)
          self.assertLess(sum(sizes[n] for n in unit[:-1]), claims.UNIT_BYTES)

  def test_a_block_larger_than_a_unit_is_a_unit(self):
    self.assertEqual(claims.units([claims.UNIT_BYTES * 3] * 4, 2), [[[0], [1]], [[2], [3]]])


class ClaimedBlocksTest(absltest.TestCase):

  def test_without_claims_a_process_writes_its_own_share(self):
    sizes = _sizes(100)
    owners = shares.owners(sizes, 3)
    for index in range(3):
      mine = list(claims.claimed_blocks(sizes, Processes(index=index, count=3), None, "s"))
      self.assertEqual(mine, [n for n, o in enumerate(owners) if o == index])

  def test_one_process_takes_over_all_but_the_first_unit_of_a_share_nobody_started(self):
    sizes = _sizes(100)
    coordinator = _Coordinator()
    first = list(claims.claimed_blocks(sizes, Processes(index=0, count=2), coordinator.as_process(0), "s"))
    # Its own share in order first, then the other's from the end, a unit at a time.
    own = [n for n, o in enumerate(shares.owners(sizes, 2)) if o == 0]
    self.assertEqual(first[:len(own)], own)
    others = claims.units(sizes, 2)[1]
    self.assertGreater(len(others), 5)
    self.assertEqual(first[len(own):], [n for unit in reversed(others[1:]) for n in unit])
    late = list(claims.claimed_blocks(sizes, Processes(index=1, count=2), coordinator.as_process(1), "s"))
    self.assertEqual(late, others[0])

  def test_a_share_of_one_unit_is_its_owners(self):
    sizes = [1 << 20] * 40  # 20 MiB a process: one unit each.
    coordinator = _Coordinator()
    first = list(claims.claimed_blocks(sizes, Processes(index=0, count=2), coordinator.as_process(0), "s"))
    self.assertEqual(first, [n for n, o in enumerate(shares.owners(sizes, 2)) if o == 0])

  def test_nothing_started_is_taken(self):
    sizes = _sizes(100)
    coordinator = _Coordinator()
    slow = claims.claimed_blocks(sizes, Processes(index=1, count=2), coordinator.as_process(1), "s")
    first_units = claims.units(sizes, 2)[1][:2]
    started = [next(slow) for _ in range(len(first_units[0]) + 1)]  # Into its second unit.
    fast = list(claims.claimed_blocks(sizes, Processes(index=0, count=2), coordinator.as_process(0), "s"))
    started += list(slow)
    self.assertEqual(started, first_units[0] + first_units[1])
    self.assertCountEqual(fast + started, range(len(sizes)))

  def test_every_block_is_written_once_and_the_processes_finish_together(self):
    sizes = _sizes(400, seed=1)
    largest_unit = claims.UNIT_BYTES + max(sizes)
    for count in (2, 3, 4):
      for seed in range(20):
        rng = random.Random(seed)
        speeds = [rng.uniform(0.1, 1) for _ in range(count)]  # Bytes per unit of time.
        coordinator = _Coordinator()
        running = {p: claims.claimed_blocks(sizes, Processes(index=p, count=count), coordinator.as_process(p), "s")
                   for p in range(count)}
        # Each process asks for its next block when it has written the last one.
        clocks, finished, written = [0.0] * count, [0.0] * count, []
        while running:
          process = min(running, key=lambda p: clocks[p])
          number = next(running[process], None)
          if number is None:
            finished[process] = clocks[process]
            del running[process]
          else:
            written.append(number)
            clocks[process] += sizes[number] / speeds[process]
        self.assertCountEqual(written, range(len(sizes)), (count, seed))
        # The last to finish started its last unit while the others were still busy.
        self.assertLessEqual(max(finished) - min(finished), largest_unit / min(speeds), (count, seed))
        static = [sum(s for s, o in zip(sizes, shares.owners(sizes, count)) if o == p) / speeds[p]
                  for p in range(count)]
        self.assertLess(max(finished), max(static), (count, seed))

  def test_shares_are_claimed_under_their_own_names(self):
    sizes = _sizes(50)
    coordinator = _Coordinator()
    list(claims.claimed_blocks(sizes, Processes(index=0, count=2), coordinator.as_process(0), "first"))
    second = list(claims.claimed_blocks(sizes, Processes(index=1, count=2), coordinator.as_process(1), "second"))
    self.assertCountEqual(second, set(range(len(sizes))) - set(claims.units(sizes, 2)[0][0]))


if __name__ == "__main__":
  absltest.main()
