"""A tensor whose bytes are read only when something asks for them, whole or a region at a time.

A conversion describes every output leaf before it reads any weight, so that it can check the whole plan first
and then write leaves under a memory budget. `LazyTensor` is that description: shape and dtype are known up
front, the values come from a picklable loader. A loader that can produce a region on its own (a stack of
per-layer tensors can load one layer) lets the writer stream a leaf far larger than memory, block by block.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Iterator, Protocol, runtime_checkable

import numpy as np

Index = tuple[slice, ...]


class TensorLoader(Protocol):
  """Returns the tensor's values. Must be picklable so a `LazyTensor` can cross process boundaries."""

  def __call__(self) -> np.ndarray:
    ...


@runtime_checkable
class RegionLoader(Protocol):
  """A loader that reads a region without materialising the rest.

  `block_shape` is its natural unit (one layer of a scanned leaf, one expert of one layer): reading a region
  aligned to it touches only the sources inside the region.
  """

  block_shape: tuple[int, ...]

  def region(self, index: Index) -> np.ndarray:
    ...


class LazyTensorLoadError(RuntimeError):
  """A `LazyTensor` could not be materialised; the message names the tensor."""


class LazyTensorWriteError(RuntimeError):
  """A `LazyTensor` could not be written; the message names the tensor and the storage error, briefly."""


def brief_error(error: BaseException, limit: int = 700) -> str:
  """A storage error without tensorstore's spec dump (which can run to kilobytes).

  Long messages keep their beginning (what failed) and their end (the operating system's reason).
  """
  text = str(error).split(" [tensorstore_spec=")[0].strip()
  if len(text) > limit:
    text = f"{text[: limit // 2]} ... {text[-limit // 2:]}"
  return f"{type(error).__name__}: {text}"


def block_indices(shape: tuple[int, ...], block_shape: tuple[int, ...]) -> Iterator[Index]:
  """Regions of `block_shape` tiling `shape` in C order (the last block on an axis may be short)."""
  ranges = [range(0, dim, block) for dim, block in zip(shape, block_shape)]
  for starts in itertools.product(*ranges):
    yield tuple(slice(s, min(s + b, d)) for s, b, d in zip(starts, block_shape, shape))


class LazyTensor:
  """Shape and dtype now, values on `np.asarray(lazy)` or a region on `lazy.read(index)`.

  The declared dtype is what the checkpoint must hold: Orbax writes the dtype of the array `__array__` returns,
  so the cast happens here rather than being left to the loader.
  """

  __slots__ = ("name", "shape", "dtype", "loader", "chunk_shape", "chunk_order", "element_order", "host_shape")

  def __init__(self, name: str, shape: tuple[int, ...], dtype: Any, loader: Callable[[], np.ndarray],
               chunk_shape: tuple[int, ...] | None = None, chunk_order: tuple[int, ...] | None = None,
               element_order: tuple[int, ...] | None = None, host_shape: tuple[int, ...] | None = None):
    self.name = name
    self.shape = tuple(int(d) for d in shape)
    self.dtype = np.dtype(dtype)
    self.loader = loader
    # The stored read unit (zarr3 inner chunk) readers should find: it divides `shape`; None: the write blocks.
    self.chunk_shape = None if chunk_shape is None else tuple(int(c) for c in chunk_shape)
    # The order the stored chunks and their elements are laid out in, outermost axis first (None: C order): the
    # axes a restoring mesh shards first, so that one host's part of each stored block is one run of bytes.
    self.chunk_order = None if chunk_order is None else tuple(int(a) for a in chunk_order)
    # The order each stored chunk's elements are laid out in, outermost first (None: C): the layout the loader's
    # blocks have in memory, so that the store copies them into its chunks without transposing.
    self.element_order = None if element_order is None else tuple(int(a) for a in element_order)
    # One restoring host's part of the tensor (it divides `shape`), stored in a database of its own so that the
    # host finds it in few objects; None: every block in the writing process's database.
    self.host_shape = None if host_shape is None else tuple(int(h) for h in host_shape)

  @property
  def ndim(self) -> int:
    return len(self.shape)

  @property
  def size(self) -> int:
    return math.prod(self.shape)

  @property
  def itemsize(self) -> int:
    return self.dtype.itemsize

  @property
  def nbytes(self) -> int:
    return self.size * self.itemsize

  @property
  def block_shape(self) -> tuple[int, ...]:
    """The largest unit the loader can produce without reading more than it returns."""
    if isinstance(self.loader, RegionLoader):
      return tuple(self.loader.block_shape)
    return self.shape

  def _checked(self, load: Callable[[], np.ndarray], expected_shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    try:
      value = np.asarray(load())
    except LazyTensorLoadError:
      raise
    except Exception as e:  # Loader failures of any kind get the tensor's name attached.
      raise LazyTensorLoadError(f"Failed to load tensor {self.name!r}: {type(e).__name__}: {e}") from e
    if value.shape != expected_shape:
      raise LazyTensorLoadError(
          f"Tensor {self.name!r}: loader returned shape {value.shape}, expected {expected_shape}"
      )
    target = self.dtype if dtype is None else np.dtype(dtype)
    return value if value.dtype == target else value.astype(target)

  def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
    del copy  # Every load produces a fresh array that nobody else holds.
    return self._checked(self.loader, self.shape, dtype)

  def read(self, index: Index) -> np.ndarray:
    """The region `index` (one slice per axis), read through the loader's region path when it has one."""
    expected = tuple(len(range(*s.indices(d))) for s, d in zip(index, self.shape))
    if isinstance(self.loader, RegionLoader):
      return self._checked(lambda: self.loader.region(index), expected, None)
    return self._checked(lambda: self.loader()[index], expected, None)

  def materialize(self) -> np.ndarray:
    return self.__array__()

  def __reduce__(self):
    return (type(self), (self.name, self.shape, self.dtype, self.loader, self.chunk_shape, self.chunk_order,
                         self.element_order, self.host_shape))

  def __deepcopy__(self, memo: dict[int, Any]) -> LazyTensor:
    # Loaders describe immutable sources (file path, tensor name, transforms); sharing them is safe and keeps
    # a deep copy from opening or duplicating file handles. Orbax deep-copies host values before writing.
    return self

  def __repr__(self) -> str:
    return f"{type(self).__name__}(name={self.name!r}, shape={self.shape}, dtype={self.dtype})"


class ShardedLazyTensor(LazyTensor):
  """A LazyTensor that Orbax records as a `jax.Array` with `sharding` (saved from N simulated devices)."""

  __slots__ = ("sharding",)

  def __init__(self, name: str, shape: tuple[int, ...], dtype: Any, loader: Callable[[], np.ndarray], sharding: Any,
               chunk_shape: tuple[int, ...] | None = None, chunk_order: tuple[int, ...] | None = None,
               element_order: tuple[int, ...] | None = None, host_shape: tuple[int, ...] | None = None):
    super().__init__(name, shape, dtype, loader, chunk_shape, chunk_order, element_order, host_shape)
    self.sharding = sharding

  def __reduce__(self):
    return (type(self), (self.name, self.shape, self.dtype, self.loader, self.sharding, self.chunk_shape,
                         self.chunk_order, self.element_order, self.host_shape))
