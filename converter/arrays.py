"""Array kernels shared by the plan's ops and the sources' dequantizers."""

from __future__ import annotations

import numpy as np

_TRANSPOSE_ROWS = 16
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
  """`x` with its last two axes swapped, C-contiguous, copied 16 source rows at a time.

  numpy's own strided copy walks the whole destination column by column and misses the cache on every
  element: 300-900 MB/s for bfloat16 weight matrices here. Copying thin slabs keeps both sides in cache:
  2-4 GB/s on the same matrices (measured on 768x2048 to 14336x4096, bfloat16 and float32). Transposes are
  most of a conversion's CPU time.
  """
  rows = x.shape[-2]
  out = np.empty(x.shape[:-2] + (x.shape[-1], rows), dtype=x.dtype)
  source, target = as_bits(x), as_bits(out)
  for start in range(0, rows, _TRANSPOSE_ROWS):
    target[..., start : start + _TRANSPOSE_ROWS] = np.swapaxes(source[..., start : start + _TRANSPOSE_ROWS, :], -1, -2)
  return out
