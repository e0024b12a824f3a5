"""Array kernels shared by the plan's ops and the sources' dequantizers."""

from __future__ import annotations

import math

import numpy as np

Shape = tuple[int, ...]  # An array's shape, everywhere in the converter.

_CACHE_LINE = 64
_SLAB_ROWS = (16, 64)  # The fewest and most source rows `transpose_last_two` copies at a time.
_SCRATCH_BYTES = 2 << 20  # ... and as many as fit here (about this machine's L2): measured best.
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


def private_copy(view: np.ndarray, dtype: np.dtype, transpose: bool = False) -> np.ndarray:
  """A fresh C-contiguous copy of `view` (a file map's, a download's) in `dtype`, with its last two axes swapped
  when `transpose`; one pass over the bytes, moved as bits, where no cast is needed."""
  if view.dtype != dtype:
    view = np.array(view, dtype=dtype, order="C")
    return transpose_last_two(view) if transpose else view
  return transpose_last_two(view) if transpose else np.array(as_bits(view), order="C", copy=True).view(dtype)


def transpose_last_two(x: np.ndarray) -> np.ndarray:
  """`x` with its last two axes swapped, C-contiguous, copied a slab of source rows at a time.

  numpy's own strided copy walks the whole destination column by column and misses the cache on every
  element. Copying a thin slab of rows at a time keeps both sides in cache, except where the row length is a
  power of two (2048 or 4096 bfloat16 values: most weight matrices): the slab's rows then fall on the same
  cache sets and evict one another as the copy reads down its columns. So each slab is first copied, row by
  row, into a scratch buffer whose rows are one cache line longer, and transposed from there (speeds in the
  README, "Larger than RAM"). Transposes are most of what a conversion does to the bytes besides
  (de)compressing them.
  """
  rows, cols = x.shape[-2:]
  out = np.empty(x.shape[:-2] + (cols, rows), dtype=x.dtype)
  source, target = as_bits(x), as_bits(out)
  if x.ndim > 2 and rows * cols * x.dtype.itemsize >= _SCRATCH_BYTES // 4:
    for i in np.ndindex(x.shape[:-2]):  # Whole matrices one by one, so that slabs stay tall.
      _transpose_into(target[i], source[i])
  else:
    _transpose_into(target, source)
  return out


def _transpose_into(target: np.ndarray, source: np.ndarray) -> None:
  """`target[...] = swapaxes(source, -1, -2)` through the padded scratch slabs `transpose_last_two` describes."""
  rows, cols = source.shape[-2:]
  itemsize = source.dtype.itemsize
  padded_row_bytes = (cols * itemsize + _CACHE_LINE) * math.prod(source.shape[:-2])
  fitting = _SCRATCH_BYTES // max(padded_row_bytes, 1)
  slab = max(_SLAB_ROWS[0], min(_SLAB_ROWS[1], 1 << max(0, fitting.bit_length() - 1)))
  scratch = np.empty(source.shape[:-2] + (slab, cols + _CACHE_LINE // itemsize), source.dtype)[..., :cols]
  for start in range(0, rows, slab):
    n = min(slab, rows - start)
    scratch[..., :n, :] = source[..., start : start + n, :]
    target[..., start : start + n] = np.swapaxes(scratch[..., :n, :], -1, -2)
