"""A save's first blocks, read on a worker thread before the save starts.

A conversion knows its leaves well before it can write them: JAX and Orbax take over half a second to load, and
meanwhile one core sits idle. `EarlyReads` reads the blocks the writer will ask for first (the same cut,
`handlers.blocks.blocks_in_order`, in the same order) on that core, up to the save's byte budget; the writer then
takes each of them (`take`) instead of reading it again. Numpy copies, casts and transposes release the GIL, so
the reads run beside the imports rather than after them.

The reads stop at the budget, or as soon as the writer takes its first block: from then on the writer reads
ahead itself, under its own budget, and blocks read early count against that budget as the writer takes them,
so a save never holds more than its budget of blocks.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Sequence

from handlers.blocks import block_target_bytes, blocks_in_order
from handlers.lazy_tensor import Index, LazyTensor


def _key(name: str, index: Index) -> tuple[str, tuple[int, ...]]:
  return name, tuple(s.start for s in index)


class EarlyReads:
  """Reads the first blocks of saving `values` (in the order the writer receives them) on a daemon thread."""

  def __init__(self, values: Sequence[LazyTensor], max_inflight_bytes: int):
    self._values = list(values)
    self._budget = max_inflight_bytes
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._blocks: dict[tuple[str, tuple[int, ...]], tuple[concurrent.futures.Future, int]] = {}
    self.read_bytes = 0  # Bytes of the blocks read (or being read) so far.
    self.taken_bytes = 0  # Of those, the bytes the writer has taken.
    self._thread = threading.Thread(target=self._read, name="early_reads", daemon=True)
    self._thread.start()

  def _read(self) -> None:
    for lazy, index, nbytes in blocks_in_order(self._values, block_target_bytes(self._budget)):
      if self.read_bytes + nbytes > self._budget:
        return
      future: concurrent.futures.Future = concurrent.futures.Future()
      with self._lock:
        if self._stop.is_set():
          return
        self._blocks[_key(lazy.name, index)] = future, nbytes
        self.read_bytes += nbytes
      try:
        future.set_result(lazy.read(index))
      except Exception as e:  # pylint: disable=broad-except  # Raised where the writer takes this block.
        future.set_exception(e)
        return

  def take(self, name: str, index: Index) -> concurrent.futures.Future | None:
    """The block `index` of the tensor named `name`, if it was read (or is being read) early; the writer must
    read it itself otherwise. No block is read early once this has been called."""
    with self._lock:
      self._stop.set()
      future, nbytes = self._blocks.pop(_key(name, index), (None, 0))
      self.taken_bytes += nbytes
      return future

  def join(self, timeout: float | None = None) -> bool:
    """Waits until no more blocks are read early (the budget is spent, a block was taken, a read failed, or the
    reads were closed); False if `timeout` passed first."""
    self._thread.join(timeout)
    return not self._thread.is_alive()

  def close(self) -> None:
    """Stops reading and drops the blocks nobody took (a save that failed before it began, or a resumed one)."""
    with self._lock:
      self._stop.set()
      self._blocks.clear()

