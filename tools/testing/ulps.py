"""Differences in units in the last place: how the tests bound float arithmetic that is not bit-exact (query
scaling, Gemma's `w + 1` norms) in float32 and bfloat16 alike."""

import ml_dtypes
import numpy as np


def spacing(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
  """One unit in the last place of `x` (float32 values) in `dtype` (float32 or bfloat16)."""
  units = np.spacing(np.abs(x.astype(np.float32)))
  if np.dtype(dtype) == np.dtype(ml_dtypes.bfloat16):
    units = units * 2.0**16  # bfloat16 keeps 16 fewer significand bits than float32 (normal numbers).
  return units


def ulps(x: np.ndarray, reference: np.ndarray) -> np.ndarray:
  """|x - reference| in units in the last place of `reference`, in `reference`'s dtype."""
  wide = reference.astype(np.float32)
  return np.abs(x.astype(np.float32) - wide) / spacing(wide, reference.dtype)
