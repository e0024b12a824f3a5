"""A bucket object's or a Hub file's tensor regions, each with one ranged read (`storage.read_span`) of the bytes
from the region's first element to its last: a run of rows is exactly its bytes; a block of a 2-D grid reads the
rows between, which are small. Nothing else of the object is fetched."""

from __future__ import annotations

import numpy as np

from converter.arrays import placed_shape, private_copy


def read(path: str, begin: int, stored: np.dtype, shape: tuple[int, ...], slices: tuple[slice, ...],
         span: tuple[int, int], dtype: np.dtype, transpose: bool = False) -> np.ndarray:
  """As mapped_file.read, for an object in a bucket."""
  del begin  # `span` is absolute.
  first, last = span
  region = tuple(s.stop - s.start for s in slices) + tuple(shape[len(slices):])
  if last <= first:
    return np.zeros(placed_shape(region, transpose), dtype)
  from converter import storage  # pylint: disable=g-import-not-at-top  (the package imports this module)

  data = storage.read_span(path, first, last).view(stored)
  strides = tuple(int(np.prod(shape[k + 1:], dtype=np.int64)) * stored.itemsize for k in range(len(shape)))
  view = np.lib.stride_tricks.as_strided(data, region, strides, writeable=False)
  return private_copy(view, dtype, transpose)
