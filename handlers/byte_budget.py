"""An asyncio byte budget: how many bytes of materialised tensor data may be alive at once."""

from __future__ import annotations

import asyncio


class ByteBudget:
  """`acquire(n)` waits until `n` more bytes fit; a request larger than the whole budget runs alone.

  Waiters are served in arrival order, so one large block cannot be starved by a stream of small ones.
  """

  def __init__(self, limit: int):
    if limit <= 0:
      raise ValueError(f"byte budget must be positive, got {limit}")
    self.limit = limit
    self.in_use = 0
    self.peak = 0
    self._condition = asyncio.Condition()
    self._queue: list[object] = []

  async def acquire(self, nbytes: int) -> None:
    ticket = object()
    async with self._condition:
      self._queue.append(ticket)
      await self._condition.wait_for(
          lambda: self._queue[0] is ticket and (self.in_use == 0 or self.in_use + nbytes <= self.limit)
      )
      self._queue.pop(0)
      self.in_use += nbytes
      self.peak = max(self.peak, self.in_use)
      self._condition.notify_all()

  async def release(self, nbytes: int) -> None:
    async with self._condition:
      self.in_use -= nbytes
      self._condition.notify_all()
