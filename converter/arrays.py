"""Array kernels shared by the plan's ops and the sources' dequantizers, and how array sizes are printed."""

from __future__ import annotations

import math

import numpy as np

Shape = tuple[int, ...]  # An array's shape, everywhere in the converter.

_CACHE_LINE = 64
_BAND_BYTES = 2 << 10  # Of each source row, `transpose_last_two` copies this many bytes at a time ...
_SLAB_ROWS = (16, 256)  # ... of at least and at most this many rows ...
_SCRATCH_BYTES = 1 << 20  # ... and of as many rows as fit here (this machine's L2 per core): measured best.
TRANSPOSE_TILE_ROWS = _SLAB_ROWS[1]  # A transpose cut into runs of this many source rows keeps its speed.
_BITS = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


def as_bits(x: np.ndarray) -> np.ndarray:
  """`x` viewed as unsigned integers of its item size, for moving values without looking at them.

  numpy moves its own integer types with its fastest strided loops; bfloat16 and the float8 types are
  ml_dtypes' dtypes, which numpy copies element by element through the dtype's functions: a strided
  bfloat16 copy (a transpose) ran 1.3 GB/s here, the same bits as uint16 1.9 GB/s.
  """
  bits = _BITS.get(x.dtype.itemsize)
  return x if bits is None or x.dtype == bits else x.view(bits)


def assign(target: np.ndarray, value: np.ndarray) -> None:
  """`target[...] = value`, moved as bits where no cast is needed."""
  if value.dtype == target.dtype:
    as_bits(target)[...] = as_bits(value)
  else:
    target[...] = value


def placed_shape(shape: Shape, transpose: bool) -> Shape:
  """`shape` with its last two axes swapped when `transpose`: the shape a read returns."""
  return tuple(shape[:-2]) + (shape[-1], shape[-2]) if transpose else tuple(shape)


def private_copy(view: np.ndarray, dtype: np.dtype, transpose: bool = False) -> np.ndarray:
  """A fresh C-contiguous copy of `view` (a file map's, a download's) in `dtype`, with its last two axes swapped
  when `transpose`; one pass over the bytes, moved as bits, where no cast is needed."""
  out = np.empty(placed_shape(view.shape, transpose), dtype)
  copy_into(out, view, transpose)
  return out


def copy_into(target: np.ndarray, view: np.ndarray, transpose: bool = False) -> None:
  """`target[...] = view` (`swapaxes(view, -1, -2)` when `transpose`), cast to `target`'s dtype; one pass over
  the bytes, moved as bits, where no cast is needed."""
  if not transpose:
    assign(target, view)
    return
  if view.dtype != target.dtype:
    view = np.array(view, dtype=target.dtype, order="C")
  transpose_into(target, view)


def transpose_last_two(x: np.ndarray) -> np.ndarray:
  """`x` with its last two axes swapped, C-contiguous, copied a tile of the source at a time.

  numpy's own strided copy walks the whole destination column by column and misses the cache on every
  element. Copying a tile (a band of 2 KiB of up to 256 source rows) at a time keeps both sides in cache, and
  each destination row receives up to 256 values per visit instead of a few cache lines' worth (a slab of whole
  rows had room for 16 to 64 of them: on 2048 x 18992 bfloat16, a vocabulary's slab, twice as slow). Where the
  row length is a power of two (2048 or 4096 bfloat16 values: most weight matrices) the tile's rows fall on the
  same cache sets and evict one another as the copy reads down its columns, so each tile is first copied, row
  by row, into a scratch buffer whose rows are one cache line longer, and transposed from there (speeds in
  docs/memory-and-streaming.md). Transposes are most of what a conversion does to the bytes besides
  (de)compressing them.
  """
  out = np.empty(placed_shape(x.shape, True), dtype=x.dtype)
  transpose_into(out, x)
  return out


def transpose_into(target: np.ndarray, source: np.ndarray) -> None:
  """`target[...] = swapaxes(source, -1, -2)` for arrays of one dtype, as `transpose_last_two` copies: where a
  caller places the transpose into a larger array, without a second copy."""
  rows, cols = source.shape[-2:]
  source, target = as_bits(source), as_bits(target)
  if source.ndim > 2 and rows * cols * source.dtype.itemsize >= _SCRATCH_BYTES // 2:
    for i in np.ndindex(source.shape[:-2]):  # Whole matrices one by one, so that tiles stay tall.
      _transpose_tiles(target[i], source[i])
  else:
    _transpose_tiles(target, source)


def _transpose_tiles(target: np.ndarray, source: np.ndarray) -> None:
  """`target[...] = swapaxes(source, -1, -2)` through the padded scratch tiles `transpose_last_two` describes."""
  rows, cols = source.shape[-2:]
  itemsize = source.dtype.itemsize
  band = min(cols, max(1, _BAND_BYTES // itemsize))
  padded_row_bytes = (band * itemsize + _CACHE_LINE) * math.prod(source.shape[:-2])
  fitting = _SCRATCH_BYTES // max(padded_row_bytes, 1)
  slab = max(_SLAB_ROWS[0], min(_SLAB_ROWS[1], 1 << max(0, fitting.bit_length() - 1)))
  scratch = np.empty(source.shape[:-2] + (slab, band + _CACHE_LINE // itemsize), source.dtype)
  for first_col in range(0, cols, band):
    width = min(band, cols - first_col)
    columns = slice(first_col, first_col + width)
    for start in range(0, rows, slab):
      n = min(slab, rows - start)
      tile = scratch[..., :n, :width]
      tile[...] = source[..., start : start + n, columns]
      target[..., columns, start : start + n] = np.swapaxes(tile, -1, -2)


def human_bytes(n: float) -> str:
  """`n` bytes as the dry runs print them: 512 B, 1.5 KiB, ..., 2.0 TiB."""
  units = ("B", "KiB", "MiB", "GiB", "TiB")
  k = 0
  while n >= 1024 and k < len(units) - 1:
    n /= 1024
    k += 1
  return f"{int(n)} B" if k == 0 else f"{n:.1f} {units[k]}"
