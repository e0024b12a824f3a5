"""Re-reads a written checkpoint block by block and compares it with the source tensors after the transform.

The comparison is exact (bytes), leaf by leaf, one block in memory at a time: a conversion that wrote the
wrong bytes anywhere (a storage fault, a bug in the save path) is caught here, independently of logits. A stored
chunk that fails its checksum (handlers/_orbax_private.py `with_chunk_checksums`) is reported as damaged, with
the block and tensorstore's own words, which name the chunk (`shard entry {i, j}/{grid} in "c/0/0"`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from converter.sources.checkpoint_reader import CheckpointReader
from converter.errors import ConversionError
from converter.planning.lazy_leaves import write_blocks
from converter.planning.plan import Plan
from handlers import DEFAULT_MAX_INFLIGHT_BYTES, Processes, shares

_READ_CACHE_BYTES = 256 << 20


@dataclasses.dataclass(frozen=True)
class VerifyReport:
  leaves: int
  blocks: int
  bytes: int
  mismatches: tuple[str, ...]


def _first_difference(stored: np.ndarray, expected: np.ndarray) -> str:
  """Where two same-shaped arrays first differ bitwise (NaN payloads included)."""
  raw = lambda a: a.view(np.dtype(f"u{a.dtype.itemsize}"))
  differing = np.argwhere(raw(stored) != raw(expected))
  return f"{len(differing)} differing values, first at {tuple(int(i) for i in differing[0])}"


def verify_checkpoint(
    plan: Plan, items_path: str, on_block: Callable[[int], None] | None = None, processes: Processes = Processes(),
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES,
) -> VerifyReport:
  """Compares every block, cut as the writer cut them under the same budget (with several processes, this
  process's share of them: byte-balanced as the writes are, so N processes verify in parallel)."""
  reader = CheckpointReader(items_path)
  mismatches: list[str] = []
  blocks = total = 0
  lazies, block_shapes, located, sizes = write_blocks(plan, max_inflight_bytes)
  mine: list[list] = [[] for _ in lazies]
  for (leaf, index), owner in zip(located, shares.owners(sizes, processes.count)):
    if owner == processes.index:
      mine[leaf].append(index)
  for leaf, lazy, block, leaf_indices in zip(plan.leaves, lazies, block_shapes, mine):
    if not leaf_indices:
      continue
    stored = reader.arrays.get(("params", "params", *leaf.path))
    if stored is None:
      mismatches.append(f"{leaf.name}: missing from the checkpoint")
      continue
    if stored.shape != leaf.shape or stored.dtype != leaf.dtype:
      mismatches.append(f"{leaf.name}: stored {stored.shape} {stored.dtype}, expected {leaf.shape} {leaf.dtype}")
      continue
    array = reader.open(stored, tuple(slice(0, b) for b in block), _READ_CACHE_BYTES)
    for index in leaf_indices:
      expected = lazy.read(index)
      where = f"{leaf.name} (from {', '.join(leaf.sources[:2])}) block at {tuple(s.start for s in index)}"
      try:
        got = array.read(index)
      except ConversionError as e:
        mismatches.append(f"{where}: damaged or unreadable: {e.__cause__ or e}")
        break  # One report per leaf is enough to act on.
      blocks += 1
      total += expected.nbytes
      if got.tobytes() != expected.tobytes():
        mismatches.append(f"{where}: {_first_difference(got, expected)}")
        break
      if on_block is not None:
        on_block(expected.nbytes)
  return VerifyReport(len(plan.leaves), blocks, total, tuple(mismatches))
