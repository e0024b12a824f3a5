"""A local file's tensor regions, through one read-only memory map per file per process (shared by every tensor
and thread, no lock on reads), copied a piece at a time, each piece's pages dropped from the process as soon as
it is copied."""

from __future__ import annotations

import mmap
import threading

import numpy as np

from numpy.lib.array_utils import byte_bounds

from converter.arrays import TRANSPOSE_TILE_ROWS, copy_into, placed_shape

_maps: dict[str, mmap.mmap] = {}
_maps_lock = threading.Lock()
_FAULT_AROUND = 2 << 20  # The largest folio the page cache maps at once (a PMD).
_PAGE = mmap.PAGESIZE
_PIECE_BYTES = 4 << 20


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
  `transpose` swaps the last two axes as it copies (`span`, the absolute byte range the slices touch, is for
  readers that fetch it whole).

  The pages are file-backed and would otherwise count towards the resident memory until the whole checkpoint had
  been read, so each piece's are dropped after its copy: a 16 MiB block read whole held its 16 MiB of pages
  mapped until it was done, on each of the loader threads (up to 100 MiB more resident on an 8 GB Llama).
  """
  del span
  mapped = _file_map(path)
  raw = np.frombuffer(mapped, dtype=np.uint8, count=int(np.prod(shape, dtype=np.int64)) * stored.itemsize,
                      offset=begin)
  view = raw.view(stored).reshape(shape)[slices]
  out = np.empty(placed_shape(view.shape, transpose), dtype)
  if not view.size:
    return out
  map_start = byte_bounds(raw)[0] - begin
  for piece in _pieces(view, transpose):
    part = view[piece]
    copy_into(out[..., piece] if transpose and view.ndim == 2 else out[piece], part, transpose)
    low, high = byte_bounds(part)
    _drop(mapped, low - map_start, high - map_start)
  del raw, view
  return out


def _pieces(view: np.ndarray, transpose: bool) -> list:
  """Runs of `view`'s first axis of about `_PIECE_BYTES`; for a 2-D transpose, runs of whole tiles' rows."""
  if view.ndim == 0:
    return [...]
  length = view.shape[0]
  per_index = view[:1].nbytes
  step = max(1, _PIECE_BYTES // per_index)
  if transpose and view.ndim == 2:
    step = max(TRANSPOSE_TILE_ROWS, step // TRANSPOSE_TILE_ROWS * TRANSPOSE_TILE_ROWS)
  return [slice(start, min(start + step, length)) for start in range(0, length, step)]


def _drop(mapped: mmap.mmap, first: int, last: int) -> None:
  """Unmaps bytes [first, last) of `mapped` from this process (they stay in the page cache)."""
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
