"""FP8 weights with block scales (`quant_method: fp8`), read as the floating tensors they encode.

DeepSeek V3/R1/V3.1/V3.2, Kimi K2 and Qwen3.5-FP8 ship every large linear weight `X.weight` as F8_E4M3 with a
sibling `X.weight_scale_inv` holding one scale per block of `quantization_config.weight_block_size` values
(rows, columns; the last block on an axis may be partial). DeepSeek V4 names the sibling `X.scale` and stores it as
F8_E8M0 (a power of two; `scale_fmt: ue8m0`), and packs its routed experts as FP4 (`expert_dtype: fp4`, fp4.py)
under the same `.scale` naming; its -Base checkpoints ship FP8 experts instead. The weight is
`float32(W) * S[r // br, c // bc]`: the scale is a multiplier, whatever "inv" in its name suggests (DeepSeek's
`weight_dequant`, MaxText's `deepseek_dequantize.py`). The block size is taken from the config and never inferred
from the shapes: with a partial last block, `rows // scale_rows` is the wrong size (transformers 5.24 gets rows
100-127 of a 200-row weight silently wrong that way).

Which tensors are quantized is read from their stored dtypes (and, for packed FP4, the config's `expert_dtype`),
never from their names alone; the names pair a weight with its scale (`SCALE_NAMINGS`).

A region is dequantized on its own, one row of blocks at a time, in float32, and rounded once to the dtype asked
for. Tensors that are not quantized (norms, embeddings, routers, V4's F32 mixers and biases) pass through unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import ml_dtypes
import numpy as np

from converter.errors import ConversionError
from converter.sources import fp4, scaled
from converter.sources.base import QuantizedSource, Region, SourceTensor
from converter.sources.safetensors import SafetensorsSource, TensorInfo

QUANT_METHOD = "fp8"
FP8_DTYPES = ("F8_E4M3", "F8_E5M2")
SCALE_DTYPES = ("F32", "BF16", "F16", "F8_E8M0")
SCALE_FORMATS = ("ue8m0",)  # `scale_fmt`: power-of-two scales (DeepSeek V3.1 on, stored F32 or F8_E8M0).
EXPERT_DTYPE = "expert_dtype"  # DeepSeek V4: how its routed experts are stored, one of EXPERT_DTYPES.
EXPERT_DTYPES = ("fp8", "fp4")


@dataclasses.dataclass(frozen=True)
class ScaleNaming:
  """How a checkpoint names a quantized weight's scales: `<stem><weight_suffix>` beside `<stem><scale_suffix>`."""

  weight_suffix: str
  scale_suffix: str
  # Whether the name alone marks a scale. Otherwise only a tensor in a dtype nothing but scales use does (a model
  # may have a parameter of its own called `.scale`).
  name_marks_scale: bool

  def scale_of(self, weight: str) -> str | None:
    if not weight.endswith(self.weight_suffix):
      return None
    return weight[: len(weight) - len(self.weight_suffix)] + self.scale_suffix

  def weight_of(self, scale: str) -> str:
    return scale[: -len(self.scale_suffix)] + self.weight_suffix

  def marks_scale(self, tensor: TensorInfo) -> bool:
    """Whether `tensor` can only be a scale of this naming (so it must have a quantized weight)."""
    return tensor.name.endswith(self.scale_suffix) and (self.name_marks_scale or tensor.dtype_code == "F8_E8M0")


SCALE_NAMINGS = (
    ScaleNaming("", "_scale_inv", name_marks_scale=True),  # DeepSeek V3/R1/V3.1/V3.2, Kimi K2, Qwen3.5-FP8.
    ScaleNaming(".weight", ".scale", name_marks_scale=False),  # DeepSeek V4.
)

@dataclasses.dataclass(frozen=True)
class Fp8BlockTensor:
  """An FP8 weight and its block scales, presented as one float32 tensor of the weight's shape."""

  weight: TensorInfo
  scale: TensorInfo
  block: tuple[int, int]  # (rows, columns) of the last two axes per scale.

  @property
  def name(self) -> str:
    return self.weight.name

  @property
  def shape(self) -> tuple[int, ...]:
    return self.weight.shape

  @property
  def dtype(self) -> np.dtype:
    return np.dtype(np.float32)

  @property
  def format(self) -> str:
    return f"{self.weight.dtype_code} x {self.scale.dtype_code} scales, {self.block[0]}x{self.block[1]} blocks"

  @property
  def files(self) -> tuple[str, ...]:
    return tuple(dict.fromkeys((self.weight.path, self.scale.path)))

  @property
  def stored_names(self) -> tuple[str, ...]:
    return (self.weight.name, self.scale.name)

  @property
  def byte_ranges(self) -> tuple[tuple[str, int, int], ...]:
    return self.weight.byte_ranges + self.scale.byte_ranges

  def read(self, dtype: np.dtype | None = None, region: Region = (), transpose: bool = False) -> np.ndarray:
    return scaled.read_scaled(
        self.shape, region, self.dtype if dtype is None else dtype, transpose, self.block,
        lambda lead, rows, cols: to_float32(self.weight.read(None, (*lead, rows, cols))),
        lambda lead, rows, cols: self.scale.read(np.float32, (*lead, rows, cols)))


def _decode_tables(dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
  """Every FP8 byte's float32 value, and every pair of bytes' two values (a uint16 read, low byte first)."""
  single = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
  pairs = np.stack([single[np.arange(65536) & 0xFF], single[np.arange(65536) >> 8]], axis=-1)
  return single, pairs


_TABLES = {np.dtype(d): _decode_tables(np.dtype(d)) for d in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)}


def to_float32(values: np.ndarray) -> np.ndarray:
  """FP8 values as float32, exactly, through a lookup table: 6-9x faster than ml_dtypes' cast (1.2-1.8 GB/s of
  FP8 here, two bytes per lookup when the last axis is even)."""
  single, pairs = _TABLES[values.dtype]
  out = np.empty(values.shape, np.float32)
  if values.shape and values.shape[-1] % 2 == 0 and values.flags.c_contiguous:
    # Every index is in the table: "clip" never clips, and, unlike the default "raise", writes into `out` unbuffered.
    np.take(pairs, values.view(np.uint16), axis=0, out=out.reshape(values.shape[:-1] + (-1, 2)), mode="clip")
  else:
    np.take(single, values.view(np.uint8), out=out, mode="clip")
  return out


def _block_size(quantization_config: Mapping[str, Any], config_path: str) -> tuple[int, int]:
  block = quantization_config.get("weight_block_size")
  if (not isinstance(block, (list, tuple)) or len(block) != 2
      or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
    raise ConversionError(
        f"{config_path}: quantization_config.weight_block_size is {block!r}; FP8 block scales need it as"
        " [rows, columns] of positive integers (it is never inferred from the tensor shapes)"
    )
  return int(block[0]), int(block[1])


def _config_choice(quantization_config: Mapping[str, Any], key: str, known: tuple[str, ...],
                   config_path: str) -> str | None:
  """`quantization_config[key]`, refused unless absent or one of `known`."""
  value = quantization_config.get(key)
  if value is not None and value not in known:
    raise ConversionError(f"{config_path}: quantization_config {key} {value!r} is not supported; supported:"
                          f" {', '.join(known)}")
  return value


def _scale_of(plain: SafetensorsSource, weight: TensorInfo) -> TensorInfo:
  """The one scale tensor beside `weight`, under whichever naming the checkpoint uses."""
  candidates = [n.scale_of(weight.name) for n in SCALE_NAMINGS]
  found = [plain.tensors[c] for c in candidates if c is not None and c in plain.tensors]
  if not found:
    names = " or ".join(repr(c) for c in candidates if c is not None)
    raise ConversionError(f"{weight.path}: tensor {weight.name!r} is {weight.dtype_code} but has no {names}: a"
                          " quantized weight cannot be read without its block scales")
  if len(found) > 1:
    raise ConversionError(f"{weight.path}: quantized weight {weight.name!r} has two scales,"
                          f" {' and '.join(repr(f.name) for f in found)}; a checkpoint names them one way")
  return found[0]


def _fp8_tensor(weight: TensorInfo, scale: TensorInfo, block: tuple[int, int], config_path: str) -> Fp8BlockTensor:
  if scale.dtype_code not in SCALE_DTYPES:
    raise ConversionError(f"{scale.path}: FP8 scale {scale.name!r} has dtype {scale.dtype_code}; expected one"
                          f" of {', '.join(SCALE_DTYPES)}")
  if len(weight.shape) < 2:
    raise ConversionError(f"{weight.path}: FP8 tensor {weight.name!r} has shape {weight.shape}; block scales need"
                          " 2 axes")
  expected = weight.shape[:-2] + tuple(math.ceil(d / b) for d, b in zip(weight.shape[-2:], block))
  if scale.shape != expected:
    raise ConversionError(
        f"{scale.path}: FP8 scale {scale.name!r} has shape {scale.shape}, but weight {weight.name!r}"
        f" {weight.shape} in {block[0]}x{block[1]} blocks (quantization_config.weight_block_size in"
        f" {config_path}) needs {expected}"
    )
  return Fp8BlockTensor(weight, scale, block)


def fp8_source(plain: SafetensorsSource, quantization_config: Mapping[str, Any],
               config_path: str) -> QuantizedSource:
  """Pairs every quantized weight with its scales and checks each pair's shapes: FP8 weights (any naming in
  `SCALE_NAMINGS`) in the config's blocks, and with `expert_dtype: fp4` packed FP4 ones (fp4.py)."""
  block = _block_size(quantization_config, config_path)
  _config_choice(quantization_config, "scale_fmt", SCALE_FORMATS, config_path)
  packed_fp4 = _config_choice(quantization_config, EXPERT_DTYPE, EXPERT_DTYPES, config_path) == "fp4"
  pairs: dict[str, SourceTensor] = {}
  for name, info in plain.tensors.items():
    is_fp4 = packed_fp4 and info.dtype_code in fp4.PACKED_DTYPES and name.endswith(".weight")
    if info.dtype_code in FP8_DTYPES:
      pairs[name] = _fp8_tensor(info, _scale_of(plain, info), block, config_path)
    elif is_fp4:
      pairs[name] = fp4.fp4_tensor(info, _scale_of(plain, info))
  scales = {n for pair in pairs.values() for n in pair.stored_names[1:]}
  tensors: dict[str, SourceTensor] = {}
  for name, info in plain.tensors.items():
    if name in scales:
      continue
    naming = next((n for n in SCALE_NAMINGS if n.marks_scale(info)), None)
    if naming is not None:
      weight_name = naming.weight_of(name)
      weight = plain.tensors.get(weight_name)
      what = ("is missing" if weight is None else f"has dtype {weight.dtype_code}, not FP8"
              + (" (packed FP4 weights need expert_dtype: fp4 in config.json)" if weight.dtype_code in
                 fp4.PACKED_DTYPES else ""))
      raise ConversionError(f"{info.path}: {name!r} is a block scale, but its weight {weight_name!r} {what}")
    tensors[name] = pairs.get(name, info)
  return QuantizedSource(plain.location, tensors, tuple(plain.files), QUANT_METHOD)
