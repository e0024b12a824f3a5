"""The tensor transforms a family description is made of. Each knows its output shape without any data.

Every op is a small frozen dataclass so that a whole leaf recipe pickles (LazyTensors cross process boundaries)
and prints readably in `--dry_run`.

Every op also knows its inverse (`inverse(input_shape)`), so MaxText -> HF conversion is derived from the same
family description as HF -> MaxText: `inverse_ops` reverses a whole recipe. `exact` says whether the round trip
op, then inverse, returns the input bit for bit in every dtype; only float arithmetic (query scaling, Gemma's
norm offset) is not exact, and each such op documents how far off it can be.
"""

from __future__ import annotations

import dataclasses
import math

import ml_dtypes
import numpy as np

from converter.arrays import Shape
from converter.arrays import transpose_last_two


# Float32 arithmetic on a block is done this many bytes of float32 at a time: a whole 16 MiB bfloat16 block made
# float32 (twice its size), then a product of that, held four blocks' worth alive beside the block.
_FLOAT32_SLAB_BYTES = 1 << 20


def _in_float32(x: np.ndarray, apply) -> np.ndarray:
  """`apply(float32 slab)` (in place on the slab, a copy) over `x`, slab by slab along its first axis, into a new
  array of x's dtype: `x` itself is left as it is."""
  if x.ndim == 0:
    y = x.astype(np.float32)
    apply(y)
    return y.astype(x.dtype)
  out = np.empty_like(x)
  step = max(1, _FLOAT32_SLAB_BYTES // max(1, 4 * math.prod(x.shape[1:])))
  for start in range(0, x.shape[0], step):
    slab = x[start:start + step].astype(np.float32)
    apply(slab)
    out[start:start + step] = slab
  return out


class Op:
  """A transform of one tensor: `shape()` for planning, `__call__` for the values, `inverse()` to undo it."""

  exact: bool = True  # inverse(op(x)) == x bit for bit, whatever the dtype.

  def shape(self, shape: Shape) -> Shape:
    raise NotImplementedError

  def __call__(self, x: np.ndarray) -> np.ndarray:
    raise NotImplementedError

  def inverse(self, input_shape: Shape) -> "Op":
    """The op mapping this op's output back to its input; `input_shape` is the shape this op was given."""
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Transpose(Op):
  """(out, in) -> (in, out): HF linear weights to MaxText kernels."""

  def shape(self, shape: Shape) -> Shape:
    return shape[::-1]

  def __call__(self, x: np.ndarray) -> np.ndarray:
    if x.T.flags.c_contiguous:  # Read in the transposed layout (the way back from chunks in the HF layout).
      return x.T
    return transpose_last_two(x) if x.ndim == 2 else np.ascontiguousarray(x.T)

  def inverse(self, input_shape: Shape) -> Op:
    return Transpose()  # Reversing the axes twice is the identity.


@dataclasses.dataclass(frozen=True)
class Permute(Op):
  """Axes reordered (`np.transpose(x, axes)`): conv kernels from torch's (out, in, *spatial) to MaxText's
  (*spatial, in, out) and the like."""

  axes: tuple[int, ...]

  def shape(self, shape: Shape) -> Shape:
    if sorted(self.axes) != list(range(len(shape))):
      raise ValueError(f"cannot permute {tuple(shape)} by {self.axes}")
    return tuple(shape[a] for a in self.axes)

  def __call__(self, x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.transpose(x, self.axes))

  def inverse(self, input_shape: Shape) -> Op:
    return Permute(tuple(int(a) for a in np.argsort(self.axes)))


@dataclasses.dataclass(frozen=True)
class Reshape(Op):
  new_shape: Shape

  def shape(self, shape: Shape) -> Shape:
    if math.prod(shape) != math.prod(self.new_shape):
      raise ValueError(f"cannot reshape {shape} to {self.new_shape}")
    return self.new_shape

  def __call__(self, x: np.ndarray) -> np.ndarray:
    return x.reshape(self.new_shape)

  def inverse(self, input_shape: Shape) -> Op:
    return Reshape(tuple(input_shape))


def _is_power_of_two(factor: float) -> bool:
  return factor > 0 and math.frexp(factor)[0] == 0.5


@dataclasses.dataclass(frozen=True)
class ScaleInFloat32(Op):
  """x * factor computed in float32 and cast back, the recipe MaxText's own converter uses for query scaling."""

  factor: float

  @property
  def exact(self) -> bool:  # type: ignore[override]
    # A power of two only moves the exponent (head_dim 16, 64, 256: 1/sqrt(D) = 2^-k); anything else rounds.
    return _is_power_of_two(self.factor)

  def shape(self, shape: Shape) -> Shape:
    return shape

  def __call__(self, x: np.ndarray) -> np.ndarray:
    factor = np.float32(self.factor)
    return _in_float32(x, lambda y: np.multiply(y, factor, out=y))

  def inverse(self, input_shape: Shape) -> Op:
    return DivideInFloat32(self.factor)


@dataclasses.dataclass(frozen=True)
class DivideInFloat32(Op):
  """x / factor in float32, cast back: undoes ScaleInFloat32(factor) to within one unit in the last place.

  Not bit-exact unless `factor` is a power of two: x * factor was rounded to the storage dtype, and several
  inputs can round to the same product, so no inverse can recover every input. Measured on 10^6 normal
  values: within 1 ulp of the original always, bit-identical for ~85-87% of elements (bfloat16 and float32,
  head_dim 32, 40, 96, 128), all of them for head_dim 64. Dividing by the same float32 constant is
  deliberate: multiplying by float32(1 / factor) instead is off by up to 2 ulp in float32 (head_dim 96) and
  bit-identical for as few as 15% of elements.
  """

  factor: float

  @property
  def exact(self) -> bool:  # type: ignore[override]
    return _is_power_of_two(self.factor)

  def shape(self, shape: Shape) -> Shape:
    return shape

  def __call__(self, x: np.ndarray) -> np.ndarray:
    factor = np.float32(self.factor)
    return _in_float32(x, lambda y: np.divide(y, factor, out=y))

  def inverse(self, input_shape: Shape) -> Op:
    return ScaleInFloat32(self.factor)


@dataclasses.dataclass(frozen=True)
class AddInFloat32(Op):
  """x + offset in float32, cast back: Gemma's `1 + w` norm scales."""

  offset: float

  def shape(self, shape: Shape) -> Shape:
    return shape

  exact = False  # x + 1 - 1 loses the low bits of small |x| (in bfloat16: everything below 2^-8 relative to 1).

  def __call__(self, x: np.ndarray) -> np.ndarray:
    offset = np.float32(self.offset)
    return _in_float32(x, lambda y: np.add(y, offset, out=y))

  def inverse(self, input_shape: Shape) -> Op:
    return AddInFloat32(-self.offset)


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

  def inverse(self, input_shape: Shape) -> Op:
    return DeinterleaveRope()


@dataclasses.dataclass(frozen=True)
class DeinterleaveRope(Op):
  """Interleaved pairs back to HF's half-split order on the last axis: new[i] = old[2i], new[i + D/2] = old[2i+1]."""

  def shape(self, shape: Shape) -> Shape:
    if shape[-1] % 2:
      raise ValueError(f"rotary head_dim must be even, got {shape[-1]}")
    return shape

  def __call__(self, x: np.ndarray) -> np.ndarray:
    return np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)

  def inverse(self, input_shape: Shape) -> Op:
    return InterleaveRope()


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

  def inverse(self, input_shape: Shape) -> Op:
    return CropRows(input_shape[0])


@dataclasses.dataclass(frozen=True)
class CropRows(Op):
  """Keeps the first `rows` of axis 0: a padded MaxText vocabulary back to the HF one (the padding is dropped)."""

  rows: int

  def shape(self, shape: Shape) -> Shape:
    if self.rows > shape[0]:
      raise ValueError(f"cannot crop {shape[0]} rows to {self.rows}")
    return (self.rows,) + tuple(shape[1:])

  def __call__(self, x: np.ndarray) -> np.ndarray:
    return x if x.shape[0] == self.rows else np.ascontiguousarray(x[: self.rows])

  def inverse(self, input_shape: Shape) -> Op:
    return PadRows(input_shape[0])


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

  def inverse(self, input_shape: Shape) -> Op:
    return CropColumns(input_shape[-1])


@dataclasses.dataclass(frozen=True)
class CropColumns(Op):
  """Keeps the first `columns` of the last axis (a padded (E, V) logits kernel back to HF's vocab)."""

  columns: int

  def shape(self, shape: Shape) -> Shape:
    if self.columns > shape[-1]:
      raise ValueError(f"cannot crop {shape[-1]} columns to {self.columns}")
    return tuple(shape[:-1]) + (self.columns,)

  def __call__(self, x: np.ndarray) -> np.ndarray:
    return x if x.shape[-1] == self.columns else np.ascontiguousarray(x[..., : self.columns])

  def inverse(self, input_shape: Shape) -> Op:
    return PadColumns(input_shape[-1])


@dataclasses.dataclass(frozen=True)
class Slot(Op):
  """Slot `index` of an axis laid out as `groups` repeats of runs of `sizes`.

  On the HF side, one projection of a fused tensor (gate and up of `gate_up_proj`, in halves or interleaved; q, k
  and v of a packed qkv); on the MaxText side (`Param.leaf_slot`), one source's place in a packed leaf (Qwen3.5's
  q, k, v and z regrouped per key head). Not invertible on its own: the other direction joins the slots of every
  param that shares the tensor, each with `place`.
  """

  axis: int
  groups: int
  sizes: tuple[int, ...]
  index: int

  def _grouped(self, shape: Shape) -> tuple[int, Shape]:
    axis = self.axis % len(shape)
    if shape[axis] != self.groups * sum(self.sizes):
      raise ValueError(f"axis {axis} of {tuple(shape)} is not {self.groups} groups of {self.sizes}")
    return axis, tuple(shape[:axis]) + (self.groups, sum(self.sizes)) + tuple(shape[axis + 1 :])

  def _columns(self) -> slice:
    start = sum(self.sizes[: self.index])
    return slice(start, start + self.sizes[self.index])

  def shape(self, shape: Shape) -> Shape:
    axis, _ = self._grouped(shape)
    return tuple(shape[:axis]) + (self.groups * self.sizes[self.index],) + tuple(shape[axis + 1 :])

  def __call__(self, x: np.ndarray) -> np.ndarray:
    axis, grouped = self._grouped(x.shape)
    part = x.reshape(grouped)[(slice(None),) * (axis + 1) + (self._columns(),)]
    return np.ascontiguousarray(part).reshape(self.shape(x.shape))

  def inverse(self, input_shape: Shape) -> Op:
    raise ValueError(f"{self} is undone by joining the slots of the tensor it shares (Slot.place)")

  def place(self, out: np.ndarray, part: np.ndarray) -> None:
    """Writes `part` into this slot of `out`, the shared tensor."""
    axis, grouped = self._grouped(out.shape)
    view = out.reshape(grouped)  # A view: `out` is C-contiguous.
    size = self.sizes[self.index]
    view[(slice(None),) * (axis + 1) + (self._columns(),)] = part.reshape(
        grouped[: axis + 1] + (size,) + grouped[axis + 2 :])


def interleaved(index: int, parts: int, length: int, axis: int = -1) -> Slot:
  """Every `parts`-th element from `index` of an axis of `length` (GPT-OSS's gate_up_proj: gate at 0::2)."""
  return Slot(axis, length // parts, (1,) * parts, index)


def halves(index: int, parts: int, length: int, axis: int = -1) -> Slot:
  """The `index`-th of `parts` equal runs of an axis of `length` (Llama 4's gate_up_proj: gate first)."""
  return Slot(axis, 1, (length // parts,) * parts, index)


@dataclasses.dataclass(frozen=True)
class IntegerIds(Op):
  """Integer ids in [0, `bound`) kept as floats, as MaxText keeps them (DeepSeek V4's hash-routing table
  `tid2eid`, a float32 Tid2EidVar): the source casts them on read, exactly wherever the save dtype holds every
  integer below `bound` (`exact_in`); the plan refuses the others. Values outside [0, bound) or not integral are
  refused on read. Converting back writes them as `hf_dtype` integers again."""

  bound: int
  hf_dtype: str = "int64"

  def exact_in(self, dtype: np.dtype) -> bool:
    """Whether `dtype` represents every integer in [0, bound)."""
    return self.bound <= 2 ** (int(ml_dtypes.finfo(dtype).nmant) + 1)

  def shape(self, shape: Shape) -> Shape:
    return shape

  def __call__(self, x: np.ndarray) -> np.ndarray:
    wide = x.astype(np.float64)
    if not (np.all(wide == np.round(wide)) and np.all((wide >= 0) & (wide < self.bound))):
      raise ValueError(f"ids outside the integers 0..{self.bound - 1}")
    return x

  def inverse(self, input_shape: Shape) -> Op:
    return IdsToIntegers(self.bound, self.hf_dtype)


@dataclasses.dataclass(frozen=True)
class IdsToIntegers(Op):
  """Float-held ids back to `hf_dtype` integers (undoes IntegerIds; refuses a value that is not one of its ids)."""

  bound: int
  hf_dtype: str = "int64"

  def shape(self, shape: Shape) -> Shape:
    return shape

  def __call__(self, x: np.ndarray) -> np.ndarray:
    return IntegerIds(self.bound)(x).astype(np.float64).astype(self.hf_dtype)

  def inverse(self, input_shape: Shape) -> Op:
    return IntegerIds(self.bound, self.hf_dtype)


def output_shape(ops: tuple[Op, ...], shape: Shape) -> Shape:
  for op in ops:
    shape = op.shape(shape)
  return tuple(shape)


def inverse_ops(ops: tuple[Op, ...], shape: Shape) -> tuple[Op, ...]:
  """The recipe that undoes `ops` applied to a tensor of `shape`: each op's inverse, last op first. A leading
  Slot is left out: undoing it needs the other slots (see Slot.place)."""
  if ops and isinstance(ops[0], Slot):
    shape, ops = ops[0].shape(shape), ops[1:]
  inverses = []
  for op in ops:
    inverses.append(op.inverse(tuple(shape)))
    shape = op.shape(shape)
  return tuple(reversed(inverses))


def is_exact(ops: tuple[Op, ...]) -> bool:
  """Whether undoing `ops` returns the original tensor bit for bit."""
  return all(op.exact for op in ops)


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
