"""FP4 weights: e2m1 values packed two to a byte with a power-of-two scale per 32 values, read as the floating
tensors they encode.

e2m1 (1 sign, 2 exponent, 1 mantissa bit) encodes 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; byte k of a packed
row holds elements 2k (low nibble) and 2k + 1 (high nibble). Two layouts ship it:

- DeepSeek V4's routed experts (`quant_method: fp8` with `expert_dtype: fp4`): `X.weight` I8 (..., out, in / 2)
  beside `X.scale` F8_E8M0 (..., out, in / 32). Unpacked, the weight is HF's own (out, in): no transpose.
  `Fp4Tensor` below; fp8.py pairs each weight with its scale.
- GPT-OSS's MXFP4 experts (mxfp4.py), stored (out, in) for HF's (in, out), which decode through `PAIRS` too.

Every value is an e2m1 number times a power of two, so the result is exact in bfloat16 and float32 alike.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

from converter.errors import ConversionError
from converter.sources import scaled
from converter.sources.base import Region
from converter.sources.safetensors import TensorInfo

GROUP = 32  # Values per scale.
PACKED_DTYPES = ("I8", "U8")
SCALE_DTYPE = "F8_E8M0"
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                       np.float32)
# Both values of every byte: element 2k is the low nibble, 2k + 1 the high one.
PAIRS = np.stack([E2M1_VALUES[np.arange(256) & 0x0F], E2M1_VALUES[np.arange(256) >> 4]], axis=-1)


@dataclasses.dataclass(frozen=True)
class Fp4Tensor:
  """A packed FP4 weight (..., out, in / 2) and its scales (..., out, in / 32), presented as (..., out, in)."""

  packed: TensorInfo
  scale: TensorInfo

  @property
  def name(self) -> str:
    return self.packed.name

  @property
  def shape(self) -> tuple[int, ...]:
    return (*self.packed.shape[:-1], 2 * self.packed.shape[-1])

  @property
  def dtype(self) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16)

  @property
  def format(self) -> str:
    return f"FP4 e2m1 ({self.packed.dtype_code} pairs x {self.scale.dtype_code} scales per {GROUP})"

  @property
  def files(self) -> tuple[str, ...]:
    return tuple(dict.fromkeys((self.packed.path, self.scale.path)))

  @property
  def stored_names(self) -> tuple[str, ...]:
    return (self.packed.name, self.scale.name)

  @property
  def byte_ranges(self) -> tuple[tuple[str, int, int], ...]:
    return self.packed.byte_ranges + self.scale.byte_ranges

  def read(self, dtype: np.dtype | None = None, region: Region = (), transpose: bool = False) -> np.ndarray:
    return scaled.read_scaled(self.shape, region, self.dtype if dtype is None else dtype, transpose, (1, GROUP),
                              self._codes, lambda lead, rows, groups: self.scale.read(np.float32, (*lead, rows, groups)))

  def _codes(self, lead: tuple[slice, ...], rows: slice, cols: slice) -> np.ndarray:
    """The e2m1 values of `cols` of `rows` in float32, from the bytes that hold them."""
    first = cols.start // 2
    packed = self.packed.read(None, (*lead, rows, slice(first, -(-cols.stop // 2))))
    return scaled.decode_bytes(packed, PAIRS, cols.start - 2 * first, cols.stop - cols.start)


def fp4_tensor(packed: TensorInfo, scale: TensorInfo) -> Fp4Tensor:
  """The pair as one tensor, after checking their dtypes and that the scale grid covers the packed values."""
  if packed.dtype_code not in PACKED_DTYPES or scale.dtype_code != SCALE_DTYPE:
    raise ConversionError(
        f"{packed.path}: packed FP4 weight {packed.name!r} ({packed.dtype_code}) and its scale {scale.name!r}"
        f" ({scale.dtype_code}) must be {' or '.join(PACKED_DTYPES)} and {SCALE_DTYPE}")
  if len(packed.shape) < 2:
    raise ConversionError(f"{packed.path}: packed FP4 weight {packed.name!r} has shape {packed.shape}; expected"
                          " (..., out, in / 2)")
  values = 2 * packed.shape[-1]  # Per row.
  expected = (*packed.shape[:-1], values // GROUP)
  if values % GROUP or scale.shape != expected:
    needs = f"scales {expected}" if values % GROUP == 0 else f"a multiple of {GROUP}"
    raise ConversionError(
        f"{scale.path}: packed FP4 weight {packed.name!r} {packed.shape} (out, in / 2: two e2m1 values per byte)"
        f" and its scale {scale.name!r} {scale.shape} (out, in / {GROUP}) do not fit: {values} values per row"
        f" need {needs}")
  return Fp4Tensor(packed, scale)
