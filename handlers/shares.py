"""Splits a save's write blocks among the processes writing one checkpoint: disjoint, byte-balanced shares,
computed from the blocks alone, so that every process derives the same assignment without communicating."""

from __future__ import annotations

import dataclasses
from typing import Sequence

# Byte-balanced is not cost-balanced: a plan's leaves cost different CPU per byte (an embedding is copied, an
# expert matrix transposed and stacked, an FP8 weight dequantized), and they come in order, so N contiguous runs
# gave one of two processes every expert and the other the embedding and the logits: it finished a second early
# and waited. Each process therefore takes several stripes spread over the whole plan.
STRIPES_PER_PROCESS = 4
# Striping only where every stripe still spans many blocks (few large blocks, such as whole safetensors shards,
# stay in contiguous runs): a stripe misplaces at most a block at each end.
MIN_BLOCKS_PER_STRIPE = 8


@dataclasses.dataclass(frozen=True)
class Processes:
  """Which of the processes saving one checkpoint together this one is. Each writes a disjoint share of the
  blocks (`owners`, handlers/claims.py); the primary creates every array's metadata and writes the `_sharding`
  entries."""

  index: int = 0
  count: int = 1
  primary: int = 0

  @property
  def is_primary(self) -> bool:
    return self.index == self.primary


def stripes_per_process(num_blocks: int, count: int) -> int:
  """How many stripes each of `count` processes takes of `num_blocks` blocks (1: one contiguous run)."""
  return max(1, min(STRIPES_PER_PROCESS, num_blocks // max(1, count * MIN_BLOCKS_PER_STRIPE)))


def owners(block_bytes: Sequence[int], count: int) -> list[int]:
  """The process that writes each block.

  The blocks in order are cut into `count * S` runs of about equal bytes (S = `stripes_per_process`), and run r
  goes to process r mod `count`: each process reads S long stretches of the source, spread over the plan, so each
  share holds a similar mix of leaves. A block goes to the run that holds its middle, so a process's share is
  within S largest blocks of 1/count of the bytes (one block where S is 1).
  """
  total = sum(block_bytes)
  if count <= 1 or total == 0:
    return [0] * len(block_bytes)
  runs = count * stripes_per_process(len(block_bytes), count)
  result, start = [], 0
  for nbytes in block_bytes:
    middle = start + nbytes / 2
    result.append(min(runs - 1, int(middle * runs // total)) % count)
    start += nbytes
  return result
