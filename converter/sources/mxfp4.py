"""MXFP4 weights (`quant_method: mxfp4`), read as the floating tensors they encode.

GPT-OSS ships its expert weights as `X_blocks` (U8, two e2m1 values per byte, low nibble first, 16 bytes per
group of 32 values) and `X_scales` (U8, one power-of-two scale 2^(s - 127) per group), both stored (out, in)
per expert: blocks (..., out, in / 32, 16), scales (..., out, in / 32). The floating tensor `X` they encode is
HF's own parameter, (..., in, out): every value is an e2m1 number times a power of two, so the result is exact in
bfloat16 and float32 alike (transformers' `convert_moe_packed_tensors`, which ends in the same transpose).

A region of the leading (expert) axes, or of rows of `X`, reads only the packed bytes it needs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import ml_dtypes
import numpy as np

from converter.arrays import copy_into, placed_shape
from converter.errors import ConversionError
from converter.sources.base import QuantizedSource, Region, SourceTensor, as_slices, squeeze_ints
from converter.sources.fp4 import GROUP, PAIRS
from converter.sources.safetensors import SafetensorsSource, TensorInfo

QUANT_METHOD = "mxfp4"
BLOCKS_SUFFIX = "_blocks"
SCALES_SUFFIX = "_scales"
_OUT_ROWS = 256  # Stored rows unpacked at a time: 256 x 2880 float32 values (3 MB) for GPT-OSS.


@dataclasses.dataclass(frozen=True)
class Mxfp4Tensor:
  """Packed e2m1 blocks and their scales, presented as one bfloat16 tensor (..., in, out)."""

  blocks: TensorInfo
  scales: TensorInfo
  name: str

  @property
  def shape(self) -> tuple[int, ...]:
    *lead, out, groups, _ = self.blocks.shape
    return (*lead, groups * GROUP, out)

  @property
  def dtype(self) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16)

  @property
  def format(self) -> str:
    return f"MXFP4 ({self.blocks.dtype_code} e2m1 blocks x {self.scales.dtype_code} 2^(s-127) scales per {GROUP})"

  @property
  def files(self) -> tuple[str, ...]:
    return tuple(dict.fromkeys((self.blocks.path, self.scales.path)))

  @property
  def stored_names(self) -> tuple[str, ...]:
    return (self.blocks.name, self.scales.name)

  @property
  def byte_ranges(self) -> tuple[tuple[str, int, int], ...]:
    return self.blocks.byte_ranges + self.scales.byte_ranges

  def read(self, dtype: np.dtype | None = None, region: Region = (), transpose: bool = False) -> np.ndarray:
    """Unpacks a few stored (out) rows at a time into the output, so the float32 intermediates stay small
    (`_OUT_ROWS` x in values) whatever the region's size. The stored rows are the tensor's columns: they are
    transposed as they are placed, unless `transpose` asks for the stored orientation itself."""
    slices = as_slices(self.shape, region)
    slices += tuple(slice(0, d) for d in self.shape[len(slices):])
    *lead, rows, cols = slices  # rows: the `in` axis (packed in groups), cols: the `out` axis.
    groups = slice(rows.start // GROUP, -(-rows.stop // GROUP))
    first = rows.start - groups.start * GROUP
    out = np.empty(placed_shape(tuple(s.stop - s.start for s in slices), transpose),
                   dtype=self.dtype if dtype is None else dtype)
    for start in range(cols.start, cols.stop, _OUT_ROWS):
      stop = min(start + _OUT_ROWS, cols.stop)
      packed = self.blocks.read(None, (*lead, slice(start, stop), groups))
      exponents = self.scales.read(None, (*lead, slice(start, stop), groups)).astype(np.int32) - 127
      values = PAIRS[packed].reshape(packed.shape[:-1] + (GROUP,))  # (..., out, groups, 32)
      values = np.ldexp(values, exponents[..., None]).reshape(packed.shape[:-2] + (-1,))
      values = values[..., first : first + rows.stop - rows.start]
      placed = slice(start - cols.start, stop - cols.start)
      copy_into(out[..., placed, :] if transpose else out[..., placed], values, not transpose)
    return squeeze_ints(out, region)


def mxfp4_source(plain: SafetensorsSource, quantization_config: Mapping[str, Any],
                 config_path: str) -> QuantizedSource:
  """Pairs every `X_blocks` with its `X_scales` as the tensor `X`; checks dtypes and shapes."""
  del quantization_config, config_path  # The format has no parameters; which tensors are packed is in the names.
  tensors: dict[str, SourceTensor] = {}
  for name, info in plain.tensors.items():
    if name.endswith(SCALES_SUFFIX) and name[: -len(SCALES_SUFFIX)] + BLOCKS_SUFFIX in plain.tensors:
      continue
    if not name.endswith(BLOCKS_SUFFIX):
      tensors[name] = info
      continue
    base = name[: -len(BLOCKS_SUFFIX)]
    scales = plain.tensors.get(base + SCALES_SUFFIX)
    if scales is None:
      raise ConversionError(f"{info.path}: MXFP4 tensor {name!r} has no {base + SCALES_SUFFIX!r}: packed blocks"
                            " cannot be read without their scales")
    if info.dtype_code != "U8" or scales.dtype_code != "U8":
      raise ConversionError(f"{info.path}: MXFP4 tensors {name!r} ({info.dtype_code}) and {scales.name!r}"
                            f" ({scales.dtype_code}) must both be U8")
    if len(info.shape) < 3 or info.shape[-1] != GROUP // 2 or info.shape[:-1] != scales.shape:
      raise ConversionError(
          f"{info.path}: MXFP4 tensor {name!r} has shape {info.shape} and its scales {scales.shape}; expected"
          f" (..., out, groups, {GROUP // 2}) and (..., out, groups)"
      )
    if base in plain.tensors:
      raise ConversionError(f"{info.path}: both {base!r} and its MXFP4 blocks {name!r} are stored")
    tensors[base] = Mxfp4Tensor(info, scales, base)
  return QuantizedSource(plain.location, tensors, tuple(plain.files), QUANT_METHOD)
