"""Each restoring host's part of the leaves in OCDBT databases of its own, written a round of blocks per commit.

Orbax saving from a mesh stores each host's shards in that host's own database (`ocdbt.process_N`), written in one
go: a host restoring from a bucket finds its part of a leaf in one run of one object, a request or two. The
converter's blocks span every host's part, and each non-transactional tensorstore write is an OCDBT commit of its
own, with a data file of its own: a host then fetches a request or two per block its shards touch
(docs/loading-on-a-pod.md). Here the pieces of each block (`handlers.blocks.host_parts`) go to their part's own
database, staged in one transaction per database and round. A stored block there may hold the pieces of several
write blocks (`handlers.blocks.host_group`) and is written whole when its round is committed, so a round closes
only where such a group of blocks ends, once it holds a quarter of the byte budget; it is committed at once, one
data file per database, while the next is read. A block's bytes stay in the budget until its round is committed
(the transaction refers to them), and only then is it reported written. A round holds at most three quarters of
the budget (a group is at most half of it), so the next can always start.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

import tensorstore as ts

from handlers.byte_budget import ByteBudget
from handlers.write_options import BlockWritten


def database_name(process: int | str, part: int) -> str:
  """The per-process OCDBT database name (`ocdbt.process_<name>`, letters and digits only) of part `part` as
  process `process` writes it: distinct per writing process, since one database has one writer."""
  return f"{process}p{part}"


class _Round:

  def __init__(self):
    self.transactions: dict[str, ts.Transaction] = {}
    self.tasks: list[asyncio.Task] = []
    self.nbytes = 0

  def transaction(self, database: str) -> ts.Transaction:
    return self.transactions.setdefault(database, ts.Transaction())


class CommitRounds:
  """Stages blocks' pieces into per-database transactions, a round at a time (see the module's docstring)."""

  def __init__(self, budget: ByteBudget, round_bytes: int, on_written: Callable[[BlockWritten], None] | None,
               track: Callable[[asyncio.Task], None]):
    """`track` is given every task started (the blocks' and the commits'), so the writer sees their failures."""
    self._budget = budget
    self._track = track
    self._round_bytes = max(1, round_bytes)
    self._on_written = on_written
    self._round = _Round()
    self._commits: list[asyncio.Task] = []

  def add(self, write: Callable[[Callable[[str], ts.Transaction]], Awaitable[BlockWritten | None]], nbytes: int,
          group_ends: bool = True) -> asyncio.Task:
    """Starts `write(transaction)`, which stages one block of `nbytes` (already in the budget) into the current
    round, each piece in `transaction(database)`. Where it ends a group of blocks (`group_ends`) and the round
    holds `round_bytes`, the round is closed: committed once every block in it is staged."""
    current = self._round
    task = asyncio.create_task(write(current.transaction))
    self._track(task)
    current.tasks.append(task)
    current.nbytes += nbytes
    if group_ends and current.nbytes >= self._round_bytes:
      self._close()
    return task

  def _close(self) -> None:
    closing, self._round = self._round, _Round()
    if closing.tasks:
      self._commits.append(asyncio.create_task(self._commit(closing)))
      self._track(self._commits[-1])

  async def _commit(self, closing: _Round) -> None:
    results = await asyncio.gather(*closing.tasks, return_exceptions=True)
    try:
      failed = next((r for r in results if isinstance(r, BaseException)), None)
      if failed is not None:
        for transaction in closing.transactions.values():
          transaction.abort()
        raise failed
      await asyncio.gather(*(t.commit_async() for t in closing.transactions.values()))
      for written in results:
        if written is not None and self._on_written is not None:
          self._on_written(written)
    finally:
      await self._budget.release(closing.nbytes)

  async def finish(self) -> None:
    """Commits the last round and waits for every commit; raises the first failure."""
    self._close()
    results = await asyncio.gather(*self._commits, return_exceptions=True)
    failed = next((r for r in results if isinstance(r, BaseException)), None)
    if failed is not None:
      raise failed
