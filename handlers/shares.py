"""Splits a save's write blocks among the processes writing one checkpoint: disjoint, byte-balanced shares,
computed from the blocks alone, so that every process derives the same assignment without communicating."""

from __future__ import annotations

from typing import Sequence


def owners(block_bytes: Sequence[int], count: int) -> list[int]:
  """The process that writes each block: blocks in order, cut into `count` contiguous runs of about equal bytes
  (a block goes to the process whose byte range holds its middle), so each process reads a few long stretches of
  the source rather than scattered pieces. Shares differ by at most about one block."""
  total = sum(block_bytes)
  if count <= 1 or total == 0:
    return [0] * len(block_bytes)
  result, start = [], 0
  for nbytes in block_bytes:
    middle = start + nbytes / 2
    result.append(min(count - 1, int(middle * count // total)))
    start += nbytes
  return result
