"""MaxText's native fp8 model from an FP8 checkpoint (`--keep_fp8`): each quantized kernel kept as its FP8 bytes,
beside the block scales MaxText's fp8 tree declares for it; half the bytes of a bfloat16 conversion.

MaxText's fp8 models (`qwen3.5-*-fp8`: `weight_dtype=float8_e4m3fn`, `weight_block_size=b`) give every kernel of a
module not listed in `unquantized_modules` a float32 sibling: `kernel_scale` for a dense kernel, `wi_0_scale`,
`wi_1_scale`, `wo_scale` for experts. A scale has, on each axis of the layer's kernel, `d // b` values where the
axis has d >= b elements and d values where it has fewer (layers/linears.py; the experts axis stays whole, and a
scanned leaf keeps its layers axis whole); `dequantize_weight` multiplies each value over the d / s consecutive
elements it covers. HF stores one scale per (rows, columns) block of the (out, in) weight, and the family's ops
(transposes, heads reshapes, Qwen3.5's per-key-head slots) move those blocks about. A kernel converts when every
MaxText block falls inside one HF block, which holds whenever the weight's dimensions are multiples of the block
(every official FP8 checkpoint); otherwise it is refused, naming the tensor and the axis.

Where each MaxText scale value comes from is found once per distinct kernel layout (every expert and every layer of
one kind share it): the family's ops run on an array of HF block numbers, which must be constant over each MaxText
block. Writing a scale leaf then only gathers values from the small HF scale grids.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from typing import Any, Callable, Sequence

import numpy as np

from converter.arrays import Shape
from converter import ops as ops_lib
from converter.errors import ConversionError
from converter.planning.loader import Loader
from converter.planning.loaders import FromTensor, JoinSlots, Stack
from converter.sources import TensorInfo
from converter.sources.fp8 import Fp8BlockTensor


# Ops that only move elements: they carry block numbers as they carry values.
_INDEX_OPS = (ops_lib.Transpose, ops_lib.Reshape, ops_lib.Slot, ops_lib.InterleaveRope, ops_lib.DeinterleaveRope)
# Leaves MaxText quantizes when their module is not unquantized: dense kernels and expert weights.
_QUANTIZABLE = ("kernel", "wi_0", "wi_1", "wo")
MAXTEXT_FP8_DTYPES = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


@dataclasses.dataclass(frozen=True)
class Fp8Output:
  """What a native fp8 conversion tells MaxText: the weight dtype, the block size, the modules left unquantized."""

  weight_dtype: str
  block: int
  unquantized_modules: tuple[str, ...]

  def overrides(self) -> dict[str, Any]:
    return dict(weight_dtype=self.weight_dtype, weight_block_size=self.block,
                unquantized_modules=self.unquantized_modules)


def quantized_in_maxtext(path: Sequence[str], unquantized_modules: Sequence[str]) -> bool:
  """Whether MaxText's fp8 tree holds this leaf in FP8 (common_types.get_weight_dtype matches module names)."""
  return path[-1] in _QUANTIZABLE and not any(
      fnmatch.fnmatch(name, pattern) for name in path[:-1] for pattern in unquantized_modules)


def scale_shape(kernel_shape: Shape, block: int) -> Shape:
  """MaxText's scale shape for one layer's (or one expert's) kernel."""
  return tuple(d if d < block else d // block for d in kernel_shape)


@dataclasses.dataclass(frozen=True)
class BlockScales:
  """Loader: one layer's scale leaf, gathered from the HF scale grids of the kernel's source tensors."""

  grids: tuple[tuple[TensorInfo, tuple[int, ...]], ...]  # (scale tensor, leading index: one expert of a fused one)
  index: np.ndarray  # Into the grids' values, flattened and concatenated in order; the leaf's shape.
  shape: Shape
  dtype: np.dtype = np.dtype(np.float32)

  @property
  def block_shape(self) -> Shape:
    return self.shape

  def source_tensors(self) -> tuple[TensorInfo, ...]:
    return tuple(grid for grid, _ in self.grids)

  def map_reads(self, read: Callable[[Loader], Loader]) -> Loader:
    del read  # Reads its scale grids whole: nothing to rewrite.
    return self

  def __call__(self) -> np.ndarray:
    values = np.concatenate([grid.read(np.float32, lead).ravel() for grid, lead in self.grids])
    return values[self.index]

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    return self()[index]



class _Converter:
  """Rewrites one plan's quantized leaves; caches block layouts across leaves."""

  def __init__(self, block: int):
    self.block = block
    self._layouts: dict[Any, np.ndarray] = {}

  def raw(self, loader: Loader, leaf: str) -> Loader:
    """The loader with every source read as its stored FP8 bytes (no scale applied)."""

    def stored(read: FromTensor) -> FromTensor:
      self._check_ops(read, leaf)
      return dataclasses.replace(read, tensor=read.tensor.weight, dtype=read.tensor.weight.dtype)

    return loader.map_reads(stored)

  def scales(self, loader: Loader, leaf: str, names: Sequence[str]) -> Loader:
    """The scale leaf's loader: stacked as the kernel is (layers and experts keep their axes whole), one layer's
    (or expert's) kernel in blocks."""
    if isinstance(loader, Stack):
      parts = tuple(self.scales(p, leaf, names) for p in loader.parts)
      part_shape = parts[0].shape
      shape = part_shape[: loader.axis] + (len(parts),) + part_shape[loader.axis :]
      return dataclasses.replace(loader, parts=parts, shape=shape, dtype=np.dtype(np.float32))
    return self._block_scales(loader, leaf, names)

  @staticmethod
  def _check_ops(loader: FromTensor, leaf: str) -> None:
    arithmetic = [op for op in loader.ops if not isinstance(op, _INDEX_OPS)]
    if arithmetic:
      raise ConversionError(
          f"{leaf}: tensor {loader.tensor.name!r} is converted with {type(arithmetic[0]).__name__}, arithmetic on"
          " its values, which its FP8 bytes cannot take; convert without --keep_fp8 (dequantized)")

  def _block_scales(self, loader: Loader, leaf: str, names: Sequence[str]) -> BlockScales:
    slotted = loader.parts if isinstance(loader, JoinSlots) else ((loader, None),)
    key = (tuple((b.ops, b.tensor.shape[len(b.lead):], b.tensor.block, slot) for b, slot in slotted), loader.shape)
    if key not in self._layouts:
      self._layouts[key] = self._layout(slotted, tuple(loader.shape), leaf, names)
    grids = tuple((b.tensor.scale, b.lead) for b, _ in slotted)
    index = self._layouts[key]
    return BlockScales(grids, index, tuple(index.shape))

  def _layout(self, slotted, kernel_shape: Shape, leaf: str, names: Sequence[str]) -> np.ndarray:
    """For each value of one layer's scale leaf, its position in the source grids (flattened, concatenated)."""
    offset, numbered = 0, []
    for base, slot in slotted:
      self._check_ops(base, leaf)
      rows, cols = base.tensor.shape[len(base.lead):]
      br, bc = base.tensor.block
      grid_cols = math.ceil(cols / bc)
      blocks = (offset + (np.arange(rows, dtype=np.int32) // br)[:, None] * grid_cols
                + (np.arange(cols, dtype=np.int32) // bc)[None, :])
      offset += math.ceil(rows / br) * grid_cols
      for op in base.ops:
        blocks = op(blocks)
      numbered.append((blocks, slot))
    if len(numbered) == 1 and numbered[0][1] is None:
      field = numbered[0][0]
    else:
      field = np.empty(kernel_shape, np.int32)
      for blocks, slot in numbered:
        slot.place(field, blocks)
    target = scale_shape(kernel_shape, self.block)
    for axis, (d, s) in enumerate(zip(kernel_shape, target)):
      if d % s:
        raise ConversionError(
            f"{leaf}: axis {axis} of its kernel {kernel_shape} has {d} elements, not a multiple of its {s} fp8"
            f" scales (MaxText's weight_block_size={self.block}); convert without --keep_fp8 (dequantized)")
    grouped = field.reshape(tuple(x for d, s in zip(kernel_shape, target) for x in (s, d // s)))
    for axis in range(len(target)):  # Each MaxText block must lie within one HF block, along every axis.
      first = np.take(grouped, [0], axis=2 * axis + 1)
      if not np.array_equal(grouped, np.broadcast_to(first, grouped.shape)):
        br, bc = slotted[0][0].tensor.block
        raise ConversionError(
            f"{leaf}: the {br}x{bc} FP8 blocks of {', '.join(repr(n) for n in names[:2])}"
            f"{' ...' if len(names) > 2 else ''} do not line up with MaxText's fp8 blocks of this kernel"
            f" {kernel_shape} (scales {target}, weight_block_size={self.block}): along axis {axis}, one MaxText"
            " block spans several HF blocks, whose scales it cannot hold; convert without --keep_fp8 (dequantized)")
    first = grouped[tuple(x for _ in target for x in (slice(None), slice(0, 1)))]
    return np.ascontiguousarray(first.reshape(target))


def native_fp8_leaves(leaves: Sequence[Any], fp8: Fp8Output, make_leaf: Callable[..., Any]) -> list[Any]:
  """`leaves` with each one MaxText holds in FP8 replaced by its FP8 kernel and its scale leaf.

  A leaf MaxText quantizes must come from FP8 tensors only (nothing is quantized here); an FP8 tensor feeding a
  leaf MaxText keeps unquantized is dequantized as in a plain conversion.
  """
  converter = _Converter(fp8.block)
  out = []
  for leaf in leaves:
    if not quantized_in_maxtext(leaf.path, fp8.unquantized_modules):
      out.append(leaf)
      continue
    plain = [t for t in leaf.loader.source_tensors() if not isinstance(t, Fp8BlockTensor)]
    if plain:
      raise ConversionError(
          f"{leaf.name}: MaxText's fp8 model holds this leaf in FP8, but its source tensor {plain[0].name!r} is"
          f" stored as {plain[0].format} ({', '.join(plain[0].files)}); --keep_fp8 never quantizes: convert without"
          " it (dequantized), or from a checkpoint that quantizes this tensor")
    kernel = converter.raw(leaf.loader, leaf.name)
    scales = converter.scales(leaf.loader, leaf.name, leaf.sources)
    out.append(make_leaf(leaf.path, leaf.shape, np.dtype(kernel.dtype), leaf.sources, kernel, leaf.logical_axes))
    out.append(make_leaf(leaf.path[:-1] + (leaf.path[-1] + "_scale",), scales.shape, np.dtype(np.float32),
                         tuple(f"{n}_scale_inv" for n in leaf.sources), scales, leaf.logical_axes))
  return out


def fp8_output(source_tensors: Sequence[Any], unquantized_modules: Sequence[str], location: str) -> Fp8Output:
  """The fp8 settings an FP8 checkpoint converts natively with: square blocks, one FP8 dtype."""
  quantized = [t for t in source_tensors if isinstance(t, Fp8BlockTensor)]
  if not quantized:
    raise ConversionError(f"{location}: --keep_fp8 needs an FP8 checkpoint (quantization_config.quant_method"
                          " fp8); this one has no FP8 weights")
  block = quantized[0].block
  if block[0] != block[1]:
    raise ConversionError(f"{location}: FP8 blocks of {block[0]}x{block[1]}; MaxText's fp8 models take one"
                          " weight_block_size for both axes: convert without --keep_fp8 (dequantized)")
  codes = sorted({t.weight.dtype_code for t in quantized})
  if len(codes) != 1 or codes[0] not in MAXTEXT_FP8_DTYPES:
    raise ConversionError(f"{location}: FP8 weights stored as {', '.join(codes)}; a native fp8 conversion needs all"
                          f" of them in one of {', '.join(MAXTEXT_FP8_DTYPES)} (MaxText has one weight_dtype)")
  return Fp8Output(MAXTEXT_FP8_DTYPES[codes[0]], block[0], tuple(unquantized_modules))

