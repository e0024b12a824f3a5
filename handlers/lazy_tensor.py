"""A tensor whose bytes are read only when something asks for them.

A conversion describes every output leaf before it reads any weight, so that it can check the whole plan first
and then materialise leaves one at a time under a memory budget. `LazyTensor` is that description: shape and
dtype are known up front, the values come from a picklable loader.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import numpy as np


class TensorLoader(Protocol):
  """Returns the tensor's values. Must be picklable so a `LazyTensor` can cross process boundaries."""

  def __call__(self) -> np.ndarray:
    ...


class LazyTensorLoadError(RuntimeError):
  """A `LazyTensor` could not be materialised; the message names the tensor."""


class LazyTensor:
  """Shape and dtype now, values on `np.asarray(lazy)`.

  The declared dtype is what the checkpoint must hold: Orbax writes the dtype of the array `__array__` returns,
  so the cast happens here rather than being left to the loader.
  """

  __slots__ = ("name", "shape", "dtype", "loader")

  def __init__(self, name: str, shape: tuple[int, ...], dtype: Any, loader: Callable[[], np.ndarray]):
    self.name = name
    self.shape = tuple(int(d) for d in shape)
    self.dtype = np.dtype(dtype)
    self.loader = loader

  @property
  def ndim(self) -> int:
    return len(self.shape)

  @property
  def size(self) -> int:
    return int(np.prod(self.shape, dtype=np.int64))

  @property
  def itemsize(self) -> int:
    return self.dtype.itemsize

  @property
  def nbytes(self) -> int:
    return self.size * self.itemsize

  def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
    del copy  # Every load produces a fresh array that nobody else holds.
    try:
      value = np.asarray(self.loader())
    except LazyTensorLoadError:
      raise
    except Exception as e:  # Loader failures of any kind get the tensor's name attached.
      raise LazyTensorLoadError(f"Failed to load tensor {self.name!r}: {type(e).__name__}: {e}") from e
    if value.shape != self.shape:
      raise LazyTensorLoadError(
          f"Tensor {self.name!r}: loader returned shape {value.shape}, declared {self.shape}"
      )
    target = self.dtype if dtype is None else np.dtype(dtype)
    return value if value.dtype == target else value.astype(target)

  def materialize(self) -> np.ndarray:
    return self.__array__()

  def __reduce__(self):
    return (LazyTensor, (self.name, self.shape, self.dtype, self.loader))

  def __deepcopy__(self, memo: dict[int, Any]) -> LazyTensor:
    # Loaders describe immutable sources (file path, tensor name, transforms); sharing them is safe and keeps
    # a deep copy from opening or duplicating file handles.
    return LazyTensor(self.name, self.shape, self.dtype, self.loader)

  def __repr__(self) -> str:
    return f"LazyTensor(name={self.name!r}, shape={self.shape}, dtype={self.dtype})"
