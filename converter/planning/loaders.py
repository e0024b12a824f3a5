"""The plan's loaders (converter/planning/loader.py's interface): one source tensor through the family's ops, a stack of
parts, parts joined into the slots of one value. Large tensors are read a slab of rows at a time (`row_slabs`)."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import numpy as np

from converter import ops as ops_lib
from converter.arrays import Shape, assign
from converter.planning.loader import Loader
from converter.ops import Op
from converter.sources import SourceTensor
from converter.sources.lora import add_update

ROW_BLOCK_BYTES = 16 << 20  # Kept under glibc's mmap threshold, as the write blocks (handlers/blocks.py).
_ELEMENTWISE = (ops_lib.ScaleInFloat32, ops_lib.AddInFloat32)
_WITHIN_HEAD = (*_ELEMENTWISE, ops_lib.InterleaveRope)


def _row_preserving(op: Op, ndim: int) -> bool:
  """Whether `op` maps each row of a 2-D tensor to the same row of its output."""
  return isinstance(op, _ELEMENTWISE) or (isinstance(op, ops_lib.Slot) and op.axis % ndim != 0)


@dataclasses.dataclass(frozen=True)
class Slabs:
  """How a run of the source tensor's rows converts on its own: source rows `unit * i` to `unit * (i + 1)` make
  index i of the output's `axis`."""

  axis: int
  unit: int


def row_slabs(ops: tuple[Op, ...], part_shape: Shape) -> Slabs | None:
  """The output axis along the source's rows, when a slab of rows converts on its own; None otherwise.

  The largest single tensors are embeddings and logits kernels (Qwen3's 151936-row tables, 1.2 GB each),
  attention projections (Llama 3 405B's q_proj: 537 MB; DeepSeek V3's o_proj: 235 MB) and one expert of a fused
  expert tensor (Llama 4 Maverick: 168 MB): reading them a slab of rows at a time keeps every block, and so the
  memory a save needs, small. Rows stay rows (embeddings, fused experts split along their columns), become
  columns (logits kernels, MLP kernels), whole heads (q/k/v kernels: (H*D, E) -> (E, H, D)) or the last axis
  (output kernels: (E, H*D) -> (H, D, E)).
  """
  if len(part_shape) != 2:
    return None
  if all(_row_preserving(op, 2) or isinstance(op, ops_lib.PadRows) for op in ops):
    return Slabs(0, 1)
  if not ops or not isinstance(ops[0], ops_lib.Transpose):
    return None
  rest = ops[1:]
  if all(isinstance(op, (*_ELEMENTWISE, ops_lib.PadColumns)) for op in rest):
    return Slabs(1, 1)
  if not isinstance(rest[0], ops_lib.Reshape) or not all(isinstance(op, _WITHIN_HEAD) for op in rest[1:]):
    return None
  rows, columns = part_shape
  heads = rest[0].new_shape
  if len(heads) == 3 and heads[0] == columns:  # (H*D, E) -> (E, H*D) -> (E, H, D): rows are whole heads.
    return Slabs(1, heads[2])
  if heads[-1] == rows and not rest[1:]:  # (E, H*D) -> (H*D, E) -> (H, D, E): rows are the last axis.
    return Slabs(len(heads) - 1, 1)
  return None


def source_order(ops: tuple[Op, ...], part_shape: Shape) -> tuple[int, ...] | None:
  """The output's axes as they lie in the source tensor's memory, outermost first, when `ops` are a 2-D transpose
  followed by reshapes only (every linear kernel, q/k/v/o projection, unpadded logits kernel): the output is then
  a view of the source's rows as they were copied out of the file, and the transposing copy can be left to the
  store, which lays each chunk out in this order (handlers/_orbax_private.with_inner_chunks) and so copies in
  memory order. None for any other ops: their output is made C-contiguous, as before."""
  if len(part_shape) != 2 or not ops or not isinstance(ops[0], ops_lib.Transpose):
    return None
  if not all(isinstance(op, (ops_lib.Reshape, ops_lib.PadColumns)) for op in ops[1:]):
    return None
  # Strides only: a map of one byte with the source's strides, never read.
  x = np.lib.stride_tricks.as_strided(np.empty(1, np.uint8), shape=part_shape, strides=(part_shape[1], 1)).T
  for op in ops[1:]:
    if isinstance(op, ops_lib.PadColumns):
      if op.columns != x.shape[-1]:
        return None  # Padding makes a new array.
      continue
    try:
      x = np.reshape(x, op.new_shape, copy=False)
    except ValueError:
      return None
  return tuple(sorted(range(x.ndim), key=lambda axis: -x.strides[axis]))


def in_source_order(loader: Loader) -> tuple[Loader, tuple[int, ...]] | None:
  """`loader` returning views in its source tensors' layout (`source_order`) instead of C-contiguous arrays, and
  that layout; None where its values cannot be (other ops, joined slots, fills) or its parts disagree."""
  if isinstance(loader, FromTensor):
    order = source_order(loader.ops, loader._part_shape)  # pylint: disable=protected-access
    return None if order is None else (dataclasses.replace(loader, in_source_order=True), order)
  if isinstance(loader, Stack):
    parts = [in_source_order(part) for part in loader.parts]
    if any(part is None for part in parts) or len({order for _, order in parts}) != 1:
      return None
    order = (loader.axis,) + tuple(a + (a >= loader.axis) for a in parts[0][1])
    return dataclasses.replace(loader, parts=tuple(part for part, _ in parts), order=order), order
  return None


def transposes(loader: Loader) -> bool:
  """Whether a source tensor reaches `loader`'s value with its axes reordered (a transpose or permutation): the
  bytes a conversion cannot merely copy, whichever layout it stores them in."""
  if isinstance(loader, FromTensor):
    return any(isinstance(op, (ops_lib.Transpose, ops_lib.Permute)) for op in loader.ops)
  if isinstance(loader, Stack):
    return any(transposes(part) for part in loader.parts)
  if isinstance(loader, JoinSlots):
    return any(transposes(part) for part, _ in loader.parts)
  return False


def _empty(shape: Shape, dtype: np.dtype, order: tuple[int, ...] | None) -> np.ndarray:
  """An uninitialised array of `shape` laid out with axis `order[0]` outermost (C order without one)."""
  if order is None:
    return np.empty(shape, dtype)
  return np.empty([shape[axis] for axis in order], dtype).transpose(np.argsort(order))


def slab_ops(ops: tuple[Op, ...], slabs: Slabs, count: int) -> tuple[Op, ...]:
  """`ops` for a slab of `count` indices of `slabs.axis`: the shape-dependent ones resized."""
  resized = []
  for op in ops:
    if isinstance(op, ops_lib.PadRows):
      op = ops_lib.PadRows(count)
    elif isinstance(op, ops_lib.PadColumns):
      op = ops_lib.PadColumns(count)
    elif isinstance(op, ops_lib.Reshape):
      op = ops_lib.Reshape(op.new_shape[: slabs.axis] + (count,) + op.new_shape[slabs.axis + 1 :])
    resized.append(op)
  return tuple(resized)


@dataclasses.dataclass(frozen=True)
class FromTensor:
  """Loader: one source tensor (or one expert's slice of it, `lead`), read in the save dtype, then the family's
  ops; large ones a slab of rows at a time (see `row_slabs`)."""

  tensor: SourceTensor
  lead: tuple[int, ...]
  ops: tuple[Op, ...]
  dtype: np.dtype
  shape: Shape
  in_source_order: bool = False  # Views in the source's layout (`source_order`), the transpose left undone.

  @property
  def _part_shape(self) -> Shape:
    return tuple(self.tensor.shape[len(self.lead):])

  @property
  def _slabs(self) -> Slabs | None:
    if math.prod(self.shape) * self.dtype.itemsize <= ROW_BLOCK_BYTES:
      return None
    return row_slabs(self.ops, self._part_shape)

  @property
  def block_shape(self) -> Shape:
    slabs = self._slabs
    if slabs is None:
      return self.shape
    index_bytes = math.prod(self.shape) // self.shape[slabs.axis] * self.dtype.itemsize
    block = list(self.shape)
    block[slabs.axis] = max(1, ROW_BLOCK_BYTES // index_bytes)
    return tuple(block)

  def _read(self, region: tuple, ops: tuple[Op, ...]) -> np.ndarray:
    """The source region with `ops` applied; a leading 2-D transpose is done by the source as it copies."""
    transpose = bool(ops) and isinstance(ops[0], ops_lib.Transpose) and len(self._part_shape) == 2
    # A private copy (the ops never see the map), transposed as it is copied unless that is left to the store.
    x = self.tensor.read(self.dtype, region, transpose=transpose and not self.in_source_order)
    if transpose and self.in_source_order:
      x = x.T
    for op in ops[1:] if transpose else ops:
      x = op(x)
    return x

  def __call__(self) -> np.ndarray:
    return self._read(self.lead, self.ops)

  def source_tensors(self) -> tuple[SourceTensor, ...]:
    return (self.tensor,)

  def map_reads(self, read: Callable[[Loader], Loader]) -> Loader:
    return read(self)

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    slabs = self._slabs
    if slabs is None:
      return self()[index]
    start, stop, _ = index[slabs.axis].indices(self.shape[slabs.axis])
    stored = self._part_shape[0]  # Rows past the stored ones are padding (a vocabulary padded for MaxText).
    rows = slice(min(start * slabs.unit, stored), min(stop * slabs.unit, stored))
    x = self._read(self.lead + (rows,), slab_ops(self.ops, slabs, stop - start))
    return x[tuple(slice(None) if axis == slabs.axis else s for axis, s in enumerate(index))]


@dataclasses.dataclass(frozen=True)
class Copy:
  """Loader: a source tensor as it is, in `dtype`: a MaxText leaf (or one layer of it) laid out again. Any region
  is read alone, so its blocks are cut on its outer axes to a slab of at most ROW_BLOCK_BYTES."""

  tensor: SourceTensor
  dtype: np.dtype

  @property
  def shape(self) -> Shape:
    return tuple(self.tensor.shape)

  @functools.cached_property
  def block_shape(self) -> Shape:
    block = list(self.shape)
    for axis in range(len(block)):
      inner = math.prod(block[axis + 1:]) * self.dtype.itemsize
      if block[axis] * inner <= ROW_BLOCK_BYTES:
        break
      fits = max(1, ROW_BLOCK_BYTES // max(1, inner))
      block[axis] = max(d for d in range(1, min(block[axis], fits) + 1) if block[axis] % d == 0)
    return tuple(block)

  def __call__(self) -> np.ndarray:
    return self.tensor.read(self.dtype)

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    return self.tensor.read(self.dtype, tuple(index))

  def source_tensors(self) -> tuple[SourceTensor, ...]:
    return (self.tensor,)

  def map_reads(self, read: Callable[[Loader], Loader]) -> Loader:
    return read(self)


@functools.lru_cache(maxsize=64)
def _factor(tensor: SourceTensor) -> np.ndarray:
  """A LoRA factor in float32, read once per process for every region of its kernel (read-only: shared)."""
  value = tensor.read(np.float32)
  value.flags.writeable = False
  return value


@dataclasses.dataclass(frozen=True)
class AddLowRank:
  """Loader: one layer's kernel (`base`, read in float32) plus `scale` a b, rounded once to `dtype`: a MaxText LoRA
  checkpoint's qwix factors merged into its base. `a` is (prod(input axes), r), `b` (r, prod(output axes)), the
  kernel's first `in_axes` axes its input side; both are small, read whole once per process. The update is summed
  over the rank as the forward merge of a PEFT adapter sums it (`sources.lora.add_update`)."""

  base: Loader
  a: SourceTensor
  b: SourceTensor
  scale: float
  in_axes: int
  dtype: np.dtype

  @property
  def shape(self) -> Shape:
    return tuple(self.base.shape)

  @property
  def block_shape(self) -> Shape:
    return tuple(self.base.block_shape)

  def __call__(self) -> np.ndarray:
    return self.region(tuple(slice(0, d) for d in self.shape))

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    index = tuple(index) + tuple(slice(0, d) for d in self.shape[len(index):])
    kernel = np.array(self.base.region(index), np.float32)
    rank = self.a.shape[-1]
    a = _factor(self.a).reshape(self.shape[:self.in_axes] + (rank,))[index[:self.in_axes]]
    b = _factor(self.b).reshape((rank,) + self.shape[self.in_axes:])[(slice(None),) + index[self.in_axes:]]
    flat = kernel.reshape(math.prod(a.shape[:-1]), -1)
    add_update(flat, a.reshape(-1, rank), b.reshape(rank, -1), self.scale)
    return flat.reshape(kernel.shape).astype(self.dtype)

  def source_tensors(self) -> tuple[SourceTensor, ...]:
    return (*self.base.source_tensors(), self.a, self.b)

  def map_reads(self, read: Callable[[Loader], Loader]) -> Loader:
    return dataclasses.replace(self, base=self.base.map_reads(read))


@dataclasses.dataclass(frozen=True)
class Stack:
  """Loader: parts stacked on a new `axis`; a region loads only the parts it spans."""

  parts: tuple[Loader, ...]
  axis: int
  shape: Shape
  dtype: np.dtype
  order: tuple[int, ...] | None = None  # The parts' layout, this axis outermost (`in_source_order`); None: C.

  @property
  def block_shape(self) -> Shape:
    part_block = tuple(self.parts[0].block_shape)
    return part_block[: self.axis] + (1,) + part_block[self.axis :]

  def source_tensors(self) -> tuple[SourceTensor, ...]:
    return tuple(t for part in self.parts for t in part.source_tensors())

  def map_reads(self, read: Callable[[Loader], Loader]) -> Loader:
    parts = tuple(part.map_reads(read) for part in self.parts)
    return dataclasses.replace(self, parts=parts, dtype=np.dtype(parts[0].dtype))

  def __call__(self) -> np.ndarray:
    return self.region(tuple(slice(0, d) for d in self.shape))

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    along = index[self.axis]
    part_index = index[: self.axis] + index[self.axis + 1 :]
    ks = range(*along.indices(self.shape[self.axis]))
    if len(ks) == 1:
      # One part (a block of one expert or layer, the common case): its region is the block, without a second
      # block-sized copy alive beside it while the block is read.
      part = self.parts[ks[0]].region(part_index)
      if self.order is not None:
        return np.expand_dims(part.astype(self.dtype, copy=False), self.axis)
      return np.ascontiguousarray(np.expand_dims(part, self.axis), dtype=self.dtype)
    out_shape = tuple(len(range(*s.indices(d))) for s, d in zip(index, self.shape))
    out = _empty(out_shape, self.dtype, self.order)
    for j, k in enumerate(ks):
      assign(out[(slice(None),) * self.axis + (j,)], self.parts[k].region(part_index))
    return out


@dataclasses.dataclass(frozen=True)
class Fill:
  """Loader: a leaf every element of which is `value`, read from no source tensor (a MaxText weight the HF model
  does not have because it is fixed there: DeepSeek V4's mHC norm scales, ones)."""

  value: float
  shape: Shape
  dtype: np.dtype

  @property
  def block_shape(self) -> Shape:
    return self.shape

  def source_tensors(self) -> tuple[SourceTensor, ...]:
    return ()

  def map_reads(self, read: Callable[[Loader], Loader]) -> Loader:
    return self

  def __call__(self) -> np.ndarray:
    return np.full(self.shape, self.value, self.dtype)

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    return np.full(tuple(len(range(*s.indices(d))) for s, d in zip(index, self.shape)), self.value, self.dtype)


@dataclasses.dataclass(frozen=True)
class JoinSlots:
  """Loader: several params' values, each written into its slot of one value (a packed projection)."""

  parts: tuple[tuple[Loader, ops_lib.Slot], ...]
  shape: Shape
  dtype: np.dtype

  @property
  def block_shape(self) -> Shape:
    return self.shape

  def source_tensors(self) -> tuple[SourceTensor, ...]:
    return tuple(t for part, _ in self.parts for t in part.source_tensors())

  def map_reads(self, read: Callable[[Loader], Loader]) -> Loader:
    parts = tuple((part.map_reads(read), slot) for part, slot in self.parts)
    return dataclasses.replace(self, parts=parts, dtype=np.dtype(parts[0][0].dtype))

  def __call__(self) -> np.ndarray:
    out = np.empty(self.shape, self.dtype)
    for loader, slot in self.parts:
      slot.place(out, loader())
    return out

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    return self()[index]
