"""Weights stored as codes with one scale per block of (rows, columns), dequantized a region at a time.

FP8 block scales (fp8.py) and compressed-tensors' integer and FP8 schemes (compressed.py: a scale per
group of inputs of a row, per row, per tensor or per block) are all `W[r, c] = code(r, c) * S[r // br, c // bc]`
over the last two axes, the last block on an axis possibly partial. Only how the codes are stored differs, so each
source supplies a reader of codes as float32 and this module does the rest once.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from converter.arrays import Shape, copy_into, placed_shape
from converter.sources.base import Region, as_slices, squeeze_ints

# Values dequantized per piece: 1 MiB of float32.
PIECE_VALUES = 1 << 18

# Codes of (leading axes, rows, columns) as a fresh C-contiguous float32 array (..., rows, columns).
CodeReader = Callable[[tuple[slice, ...], slice, slice], np.ndarray]
# Scales of (leading axes, row blocks, column blocks) as float32 (..., row blocks, column blocks).
ScaleReader = Callable[[tuple[slice, ...], slice, slice], np.ndarray]


def decode_bytes(data: np.ndarray, table: np.ndarray, begin: int, count: int) -> np.ndarray:
  """`count` codes from the `begin`-th of the bytes `data` (..., n) hold, as float32 (..., count): each byte's
  codes are its row of `table` (256, codes a byte), lowest bits first (FP4's e2m1 pairs, packed INT2/4/8)."""
  data = data.view(np.uint8)
  values = np.empty(data.shape + (table.shape[1],), np.float32)
  # Every byte is in the table: "clip" never clips, and, unlike the default "raise", writes unbuffered (10x faster
  # than indexing the table with the bytes).
  np.take(table, data, axis=0, out=values, mode="clip")
  values = values.reshape(data.shape[:-1] + (-1,))
  if begin == 0 and values.shape[-1] == count:
    return values
  return np.ascontiguousarray(values[..., begin : begin + count])


def _steps(start: int, stop: int, step: int, block: int) -> list[tuple[int, int]]:
  """[start, stop) cut into pieces of `step`, which end on `block` edges where `step` holds whole blocks."""
  pieces, left = [], start
  while left < stop:
    right = min(left - left % block + step if step >= block else left + step, stop)
    pieces.append((left, right))
    left = right
  return pieces


def read_scaled(shape: Shape, region: Region, dtype: np.dtype, transpose: bool, block: tuple[int, int],
                codes: CodeReader, scales: ScaleReader) -> np.ndarray:
  """`region` of the weight, in `dtype`, its last two axes swapped when `transpose`.

  Dequantizes a piece of about `PIECE_VALUES` values at a time (whole rows, and several of them, where rows are
  short; else part of one row) straight into the output, so that beside the output only a piece's float32
  temporaries live whatever the region's size or row length, and each value is rounded once, from float32.
  """
  slices = as_slices(shape, region)
  slices += tuple(slice(0, d) for d in shape[len(slices):])
  *lead, rows, cols = slices
  lead = tuple(lead)
  br, bc = block
  sizes = tuple(s.stop - s.start for s in slices)
  out = np.empty(placed_shape(sizes, transpose), dtype=dtype)
  if 0 in sizes:
    return squeeze_ints(out, region)
  lead_count = math.prod(sizes[:-2])
  if lead_count * sizes[-1] <= PIECE_VALUES:
    row_step = max(1, PIECE_VALUES // (lead_count * sizes[-1]))
    row_step, col_step = (row_step - row_step % br if row_step > br else row_step), sizes[-1]
  else:
    col_step = max(1, PIECE_VALUES // lead_count)
    row_step, col_step = 1, (col_step - col_step % bc if col_step > bc else col_step)
  first_row_block, first_column_block = rows.start // br, cols.start // bc
  grid = scales(lead, slice(first_row_block, -(-rows.stop // br)), slice(first_column_block, -(-cols.stop // bc)))
  for start, stop in _steps(rows.start, rows.stop, row_step, br):
    piece_rows = grid[..., start // br - first_row_block : -(-stop // br) - first_row_block, :]
    if br > 1:
      piece_rows = np.repeat(piece_rows, br, axis=-2)[..., start % br : start % br + stop - start, :]
    for left, right in _steps(cols.start, cols.stop, col_step, bc):
      values = codes(lead, slice(start, stop), slice(left, right))
      piece = piece_rows[..., left // bc - first_column_block : -(-right // bc) - first_column_block]
      if left % bc == 0 and (right - left) % bc == 0:
        grouped = values.reshape(values.shape[:-1] + (-1, bc))  # A view: every block's values on an axis.
        grouped *= piece[..., None]
      else:
        values *= np.repeat(piece, bc, axis=-1)[..., left % bc : left % bc + right - left]
      r, c = slice(start - rows.start, stop - rows.start), slice(left - cols.start, right - cols.start)
      copy_into(out[..., c, r] if transpose else out[..., r, c], values, transpose)  # Rounded once.
  return squeeze_ints(out, region)
