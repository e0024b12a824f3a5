"""Taking over the end of a slower process's share: each process writes its own share (handlers/shares.py) a unit
at a time, and once it has started all of it, takes units from the end of the others' shares that nobody has
started yet. The shares then finish together, however unevenly the processes run (hosts and cores differ, and
so do their disks and links to a bucket).

Every unit is claimed through `Claims` before its first block is read, and a claim is first come, first served,
so each unit is written by exactly one process. An owner claims its units in order and a taker claims from the
end, the highest unit nobody holds, so once an owner finds a unit taken, every later unit is taken too, and once
a taker finds a unit its owner holds, every earlier one is the owner's. A share's first unit is never taken: a
share of one unit (every share of a small checkpoint) is written by its owner, exactly as `shares.owners` has it.
"""

from __future__ import annotations

from typing import Iterator, Protocol, Sequence

from handlers import shares

# Two write blocks: a claim is one round trip to the coordinator (under a millisecond), and a share's last unit is
# about what the others may wait for at the end.
UNIT_BYTES = 32 << 20


class Claims(Protocol):
  """First-come claims on units of work, shared by every process of one save."""

  def claim(self, share: str, owner: int, unit: int) -> int:
    """Claims unit `unit` of process `owner`'s part of `share` (a name the processes agree on) for this process,
    unless some process has claimed it already; returns the index of the process that holds it."""


def units(block_bytes: Sequence[int], count: int, unit_bytes: int | None = None) -> list[list[list[int]]]:
  """Each process's blocks (their numbers in plan order), its share (`shares.owners`) cut into units of at least
  `unit_bytes` (`UNIT_BYTES` as it stands at the call, or whatever the share's last blocks add up to)."""
  if unit_bytes is None:
    unit_bytes = UNIT_BYTES
  by_process: list[list[list[int]]] = [[] for _ in range(count)]
  open_bytes = [unit_bytes] * count
  for number, (nbytes, owner) in enumerate(zip(block_bytes, shares.owners(block_bytes, count))):
    if open_bytes[owner] >= unit_bytes:
      by_process[owner].append([])
      open_bytes[owner] = 0
    by_process[owner][-1].append(number)
    open_bytes[owner] += nbytes
  return by_process


def claimed_blocks(block_bytes: Sequence[int], processes: shares.Processes, claims: Claims | None,
                   share: str) -> Iterator[int]:
  """The numbers of the blocks this process writes, in the order to write them: its own units while it wins
  them, then units taken from the end of the other processes' shares. Each unit is claimed when its first block
  is asked for, so iterate no further ahead than the blocks about to be read. Without `claims`, the process's
  own share, as `shares.owners` assigns it."""
  mine = processes.index
  by_process = units(block_bytes, processes.count)
  for unit, numbers in enumerate(by_process[mine]):
    if unit > 0 and claims is not None and claims.claim(share, mine, unit) != mine:
      break  # Taken, and so is every later unit.
    yield from numbers
  if claims is None:
    return
  for step in range(1, processes.count):
    owner = (mine + step) % processes.count
    for unit in reversed(range(1, len(by_process[owner]))):
      holder = claims.claim(share, owner, unit)
      if holder == owner:
        break  # The owner has come this far.
      if holder == mine:
        yield from by_process[owner][unit]
