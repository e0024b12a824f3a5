"""What the plan reads weights through: named tensors with a shape and a floating dtype, read region by region.

A source hides how a checkpoint stores its tensors. A plain safetensors file stores each tensor as it is; a
quantized checkpoint stores a weight as packed values plus scales, and its source presents the pair as the one
floating tensor they encode (the scales are consumed, so they are not tensors of the model). The plan asks for a
region (a run of rows, one expert) cast to the save dtype, and never sees the storage format, only its name.

Sources know nothing of model families or of Orbax. Tensors are small frozen records (file paths, offsets,
block sizes) so that a plan, and the lazy leaves built from it, pickle across process boundaries.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Protocol, Sequence, runtime_checkable

import ml_dtypes
import numpy as np

from converter.arrays import Shape
from converter.checkpoint_format.record import SourceFacts

# A region of a tensor: an int (drops the axis) or a step-1 slice for each of its leading axes; the axes after
# them are whole.
Region = tuple[int | slice, ...]

FLOATING = frozenset(np.dtype(d) for d in (np.float64, np.float32, np.float16, ml_dtypes.bfloat16))


@runtime_checkable
class SourceTensor(Protocol):
  """One tensor of the model as a source presents it."""

  @property
  def name(self) -> str:
    """The model's name for the tensor (a quantized weight is named as its floating twin would be)."""

  @property
  def shape(self) -> Shape:
    ...

  @property
  def dtype(self) -> np.dtype:
    """What `read` returns when asked for no dtype: the stored dtype, or the precision a dequantization yields."""

  @property
  def format(self) -> str:
    """How it is stored, for `--dry_run` and messages: "BF16", "F8_E4M3 x F32 scales, 128x128 blocks", ..."""

  @property
  def files(self) -> tuple[str, ...]:
    """Every file its bytes come from (errors name them; a resumed run checks they did not change)."""

  @property
  def stored_names(self) -> tuple[str, ...]:
    """The stored tensors it is made of (itself, or a quantized weight and its scales)."""

  @property
  def byte_ranges(self) -> tuple[tuple[str, int, int], ...]:
    """(file, begin, end) of every stored tensor it is made of: what a read of all of it fetches."""

  def read(self, dtype: np.dtype | None = None, region: Region = (), transpose: bool = False) -> np.ndarray:
    """A fresh C-contiguous array of `region`, in `dtype`; only the bytes the region needs are read.

    `transpose`: with its last two axes swapped (an HF (out, in) weight as a MaxText (in, out) kernel); a source
    that copies out of a file map swaps them as it copies, one pass over the bytes instead of two.
    """


class TensorSource(Protocol):
  """The tensors of one checkpoint, by name."""

  @property
  def location(self) -> str:
    """The checkpoint's directory (or URL), for messages."""

  @property
  def tensors(self) -> Mapping[str, SourceTensor]:
    ...

  @property
  def files(self) -> Sequence[str]:
    ...

  @property
  def quant_method(self) -> str | None:
    """config.json's quantization_config.quant_method the source dequantizes ("fp8", "mxfp4"), or None."""

  @property
  def facts(self) -> SourceFacts:
    """What a conversion from this source records of it (converter/checkpoint_format/record.py)."""

  @property
  def read_cache_bytes(self) -> int:
    """The most its reads' caches hold at once in each process (what `--dry_run` adds for them)."""


@dataclasses.dataclass(frozen=True)
class QuantizedSource:
  """A plain source whose quantized weights are presented dequantized (the scales they consume are not listed)."""

  location: str
  tensors: Mapping[str, SourceTensor]
  files: tuple[str, ...]
  quant_method: str
  read_cache_bytes = 0

  @property
  def facts(self) -> SourceFacts:
    return SourceFacts(quant_method=self.quant_method)


def region_bounds(shape: Shape, region: Region) -> tuple[tuple[int, int], ...]:
  """(start, stop) on each leading axis `region` covers; raises ValueError for steps or out-of-range ints."""
  if len(region) > len(shape):
    raise ValueError(f"region {region} has more axes than shape {shape}")
  bounds = []
  for index, size in zip(region, shape):
    if isinstance(index, slice):
      start, stop, step = index.indices(size)
      if step != 1:
        raise ValueError(f"region {region}: only step-1 slices are supported")
      bounds.append((start, max(start, stop)))
    else:
      i = int(index)
      if not -size <= i < size:
        raise ValueError(f"region {region}: index {i} out of range for axis of size {size}")
      i %= size
      bounds.append((i, i + 1))
  return tuple(bounds)


def region_shape(shape: Shape, region: Region) -> Shape:
  """The shape `tensor[region]` has (ints drop their axis)."""
  bounds = region_bounds(shape, region)
  kept = tuple(stop - start for (start, stop), index in zip(bounds, region) if isinstance(index, slice))
  return kept + tuple(shape[len(region):])


def as_slices(shape: Shape, region: Region) -> tuple[slice, ...]:
  """`region` with every int made a length-1 slice (the axis kept), for reading before squeezing."""
  return tuple(slice(start, stop) for start, stop in region_bounds(shape, region))


def squeeze_ints(value: np.ndarray, region: Region) -> np.ndarray:
  """Drops the axes `region` indexed with an int (they were read as length-1 slices)."""
  axes = tuple(axis for axis, index in enumerate(region) if not isinstance(index, slice))
  return value.reshape(tuple(d for axis, d in enumerate(value.shape) if axis not in axes)) if axes else value


def nbytes(shape: Shape, dtype: np.dtype) -> int:
  return math.prod(shape) * np.dtype(dtype).itemsize
