"""A local file's tensor regions, through one read-only memory map per file per process (shared by every tensor
and thread, no lock on reads), with the pages read dropped from the process right after each copy."""

from __future__ import annotations

import mmap
import threading

import numpy as np

from converter.arrays import private_copy

_maps: dict[str, mmap.mmap] = {}
_maps_lock = threading.Lock()
_FAULT_AROUND = 2 << 20  # The largest folio the page cache maps at once (a PMD).
_PAGE = mmap.PAGESIZE


def _file_map(path: str) -> mmap.mmap:
  mapped = _maps.get(path)
  if mapped is None:
    with _maps_lock:
      mapped = _maps.get(path)
      if mapped is None:
        with open(path, "rb") as f:
          mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        _maps[path] = mapped
  return mapped


def read(path: str, begin: int, stored: np.dtype, shape: tuple[int, ...], slices: tuple[slice, ...],
         span: tuple[int, int], dtype: np.dtype, transpose: bool = False) -> np.ndarray:
  """A C-ordered private copy of `[slices]` of the tensor stored at byte `begin` of `path`, cast to `dtype`;
  `span` is the absolute byte range the slices touch; `transpose` swaps the last two axes as it copies.

  The pages are file-backed and would otherwise count towards the resident memory until the whole checkpoint had
  been read, so they are dropped after the copy.
  """
  mapped = _file_map(path)
  raw = np.frombuffer(mapped, dtype=np.uint8, count=int(np.prod(shape, dtype=np.int64)) * stored.itemsize,
                      offset=begin)
  view = raw.view(stored).reshape(shape)[slices]
  copy = private_copy(view, dtype, transpose)
  del raw, view
  first, last = span
  if last > first:
    # A fault maps cached neighbours too (fault-around, whole large folios of the page cache: measured here, a
    # 256 KiB read left 400 KiB beyond it mapped): left mapped, they add up over thousands of small reads
    # (Qwen3.5's experts and their scale grids: 0.5 GB of file pages resident on a 1 GB checkpoint). Dropping
    # them too costs a neighbour read later only a minor fault.
    start = max(0, first - first % _PAGE - _FAULT_AROUND)
    stop = min(len(mapped), last + _FAULT_AROUND)
    try:
      mapped.madvise(mmap.MADV_DONTNEED, start, stop - start)
    except (OSError, ValueError, AttributeError):
      pass  # Only a memory hint; reading stays correct without it.
  return copy
