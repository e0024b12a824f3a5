"""CommitRounds on its own: pieces staged per database and round, a round closed only where a group of blocks ends,
each block reported written (and its bytes given back to the budget) once its round is committed, a failure
aborting its round and reaching the writer."""

import asyncio
from unittest import mock

import tensorstore as ts
from absl.testing import absltest

from handlers import host_databases
from handlers.byte_budget import ByteBudget
from handlers.write_options import BlockWritten


class _Databases:
  """One memory key-value store per database name; each staged block a key in each of `databases`."""

  def __init__(self):
    self.stores: dict[str, ts.KvStore] = {}
    self.visible_when_reported: list[bool] = []

  def store(self, database: str) -> ts.KvStore:
    if database not in self.stores:
      self.stores[database] = ts.KvStore.open({"driver": "memory"}, context=ts.Context()).result()
    return self.stores[database]

  def keys(self, database: str) -> list[str]:
    return sorted(key.decode() for key in self.stores[database].list().result())

  def writer(self, number: int, databases: tuple[str, ...], fail: bool = False):
    async def write(transaction) -> BlockWritten:
      for database in databases:
        store = self.store(database)
        await store.with_transaction(transaction(database)).write(f"block{number}", b"x")
      if fail:
        raise OSError(f"block {number} lost")
      return BlockWritten("a", (number,), (number + 1,), 1, tuple(((number,), (number + 1,), d) for d in databases))
    return write

  def reported(self, event: BlockWritten) -> None:
    self.visible_when_reported.append(all(
        self.stores[database].read(f"block{start[0]}").result().state == "value"
        for start, _, database in event.pieces))


async def _run(blocks: list[tuple[int, tuple[str, ...], bool]], round_bytes: int, databases: _Databases,
               fail: int | None = None):
  """Stages one-byte blocks (number, databases, ends a group); returns (what was reported, the commits' rounds,
  the budget, the failure if any)."""
  budget, tasks, reported, rounds = ByteBudget(100), [], [], []
  commit = host_databases.CommitRounds._commit

  async def recorded(commit_rounds, closing):
    rounds.append(len(closing.tasks))
    await commit(commit_rounds, closing)

  def on_written(event: BlockWritten) -> None:
    databases.reported(event)
    reported.append(event.start[0])

  with mock.patch.object(host_databases.CommitRounds, "_commit", recorded):
    commit_rounds = host_databases.CommitRounds(budget, round_bytes, on_written, tasks.append)
    for number, names, group_ends in blocks:
      await budget.acquire(1)
      commit_rounds.add(databases.writer(number, names, fail=number == fail), 1, group_ends)
    failure = None
    try:
      await commit_rounds.finish()
    except OSError as e:
      failure = e
    await asyncio.gather(*tasks, return_exceptions=True)
  return reported, rounds, budget, failure


class CommitRoundsTest(absltest.TestCase):

  def test_rounds_close_where_a_group_ends_and_report_once_committed(self):
    databases = _Databases()
    # Groups of three blocks, rounds of at least two bytes: each round one whole group.
    blocks = [(n, ("0p0", "0p1"), n % 3 == 2) for n in range(9)]
    reported, rounds, budget, failure = asyncio.run(_run(blocks, 2, databases))
    self.assertIsNone(failure)
    self.assertEqual(rounds, [3, 3, 3])
    self.assertCountEqual(reported, range(9))
    self.assertTrue(all(databases.visible_when_reported))
    self.assertEqual(budget.in_use, 0)
    for database in ("0p0", "0p1"):
      self.assertEqual(databases.keys(database), sorted(f"block{n}" for n in range(9)))

  def test_a_failed_block_aborts_its_round_reports_none_of_it_and_gives_its_bytes_back(self):
    databases = _Databases()
    blocks = [(n, ("0p0",), n % 2 == 1) for n in range(6)]
    reported, rounds, budget, failure = asyncio.run(_run(blocks, 2, databases, fail=3))
    self.assertIsInstance(failure, OSError)
    self.assertEqual(rounds, [2, 2, 2])
    self.assertCountEqual(reported, [0, 1, 4, 5])  # Block 3's round (2 and 3) was never committed.
    self.assertEqual(databases.keys("0p0"), ["block0", "block1", "block4", "block5"])
    self.assertEqual(budget.in_use, 0)

  def test_database_names_are_per_writing_process_and_part(self):
    self.assertEqual(host_databases.database_name(0, 3), "0p3")
    self.assertEqual(host_databases.database_name(2, 0), "2p0")
    self.assertNotEqual(host_databases.database_name(1, 12), host_databases.database_name(11, 2))


if __name__ == "__main__":
  absltest.main()
