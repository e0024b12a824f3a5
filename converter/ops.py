"""The tensor transforms a family description is made of. Each knows its output shape without any data.

Every op is a small frozen dataclass so that a whole leaf recipe pickles (LazyTensors cross process boundaries)
and prints readably in `--dry_run`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

Shape = tuple[int, ...]


class Op:
  """A transform of one tensor: `shape()` for planning, `__call__` for the values."""

  def shape(self, shape: Shape) -> Shape:
    raise NotImplementedError

  def __call__(self, x: np.ndarray) -> np.ndarray:
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Transpose(Op):
  """(out, in) -> (in, out): HF linear weights to MaxText kernels."""

  def shape(self, shape: Shape) -> Shape:
    return shape[::-1]

  def __call__(self, x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.T)


@dataclasses.dataclass(frozen=True)
class Reshape(Op):
  new_shape: Shape

  def shape(self, shape: Shape) -> Shape:
    if math.prod(shape) != math.prod(self.new_shape):
      raise ValueError(f"cannot reshape {shape} to {self.new_shape}")
    return self.new_shape

  def __call__(self, x: np.ndarray) -> np.ndarray:
    return x.reshape(self.new_shape)


@dataclasses.dataclass(frozen=True)
class ScaleInFloat32(Op):
  """x * factor computed in float32 and cast back, the recipe MaxText's own converter uses for query scaling."""

  factor: float

  def shape(self, shape: Shape) -> Shape:
    return shape

  def __call__(self, x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float32) * np.float32(self.factor)).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class AddInFloat32(Op):
  """x + offset in float32, cast back: Gemma's `1 + w` norm scales."""

  offset: float

  def shape(self, shape: Shape) -> Shape:
    return shape

  def __call__(self, x: np.ndarray) -> np.ndarray:
    return (x.astype(np.float32) + np.float32(self.offset)).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class InterleaveRope(Op):
  """Half-split RoPE order to interleaved pairs on the last axis: new[2i] = old[i], new[2i+1] = old[i + D/2]."""

  def shape(self, shape: Shape) -> Shape:
    if shape[-1] % 2:
      raise ValueError(f"rotary head_dim must be even, got {shape[-1]}")
    return shape

  def __call__(self, x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.stack([x[..., :half], x[..., half:]], axis=-1).reshape(x.shape)


@dataclasses.dataclass(frozen=True)
class PadRows(Op):
  """Zero-pads axis 0 to `rows`: a vocabulary larger in MaxText than in the HF checkpoint."""

  rows: int

  def shape(self, shape: Shape) -> Shape:
    if self.rows < shape[0]:
      raise ValueError(f"cannot pad {shape[0]} rows down to {self.rows}")
    return (self.rows,) + tuple(shape[1:])

  def __call__(self, x: np.ndarray) -> np.ndarray:
    if x.shape[0] == self.rows:
      return x
    out = np.zeros((self.rows,) + x.shape[1:], dtype=x.dtype)
    out[: x.shape[0]] = x
    return out


@dataclasses.dataclass(frozen=True)
class PadColumns(Op):
  """Zero-pads the last axis to `columns` (an (E, V) logits kernel)."""

  columns: int

  def shape(self, shape: Shape) -> Shape:
    if self.columns < shape[-1]:
      raise ValueError(f"cannot pad {shape[-1]} columns down to {self.columns}")
    return tuple(shape[:-1]) + (self.columns,)

  def __call__(self, x: np.ndarray) -> np.ndarray:
    if x.shape[-1] == self.columns:
      return x
    out = np.zeros(x.shape[:-1] + (self.columns,), dtype=x.dtype)
    out[..., : x.shape[-1]] = x
    return out


def output_shape(ops: tuple[Op, ...], shape: Shape) -> Shape:
  for op in ops:
    shape = op.shape(shape)
  return tuple(shape)


# Building blocks the family files share.
def to_heads_kernel(hidden: int, heads: int, head_dim: int) -> tuple[Op, ...]:
  """q/k/v projection (H*D, E) -> kernel (E, H, D)."""
  return (Transpose(), Reshape((hidden, heads, head_dim)))


def to_out_kernel(hidden: int, heads: int, head_dim: int) -> tuple[Op, ...]:
  """o projection (E, H*D) -> kernel (H, D, E)."""
  return (Transpose(), Reshape((heads, head_dim, hidden)))


def to_heads_bias(heads: int, head_dim: int) -> tuple[Op, ...]:
  """q/k/v bias (H*D,) -> (H, D)."""
  return (Reshape((heads, head_dim)),)
