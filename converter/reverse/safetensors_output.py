"""Writing HuggingFace safetensors: headers, shards of a bounded size, tensors streamed piece by piece."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import struct
from typing import Any, Mapping, Sequence

import numpy as np

from converter.arrays import Shape
from converter import storage
from converter.errors import ConversionError
from converter.sources import SAFETENSORS_DTYPES

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_SAFETENSORS_CODES = {dtype: code for code, dtype in SAFETENSORS_DTYPES.items()}
_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20,
               "GIB": 2**30, "TIB": 2**40}


def parse_size(size: int | str) -> int:
  """Bytes in "5GB", "500MB", "2GiB" or "123" (decimal units like HF's `max_shard_size`, binary with "i")."""
  if isinstance(size, int) and not isinstance(size, bool):
    value = size
  else:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(size))
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _SIZE_UNITS:
      raise ConversionError(f"--max_shard_size={size!r}: expected a size such as 5GB, 500MB, 2GiB or a byte count")
    value = int(float(match.group(1)) * _SIZE_UNITS[unit])
  if value <= 0:
    raise ConversionError(f"--max_shard_size={size!r}: must be positive")
  return value


@dataclasses.dataclass(frozen=True)
class TensorSpec:
  """A tensor as a safetensors header describes it: no data."""

  name: str
  shape: Shape
  dtype: np.dtype

  @property
  def nbytes(self) -> int:
    return math.prod(self.shape) * self.dtype.itemsize


def safetensors_header(specs: Sequence[TensorSpec], metadata: Mapping[str, str] | None = None) -> bytes:
  """The 8-byte length and JSON header of a safetensors file holding `specs` back to back, in that order."""
  header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
  offset = 0
  for spec in specs:
    if spec.dtype not in _SAFETENSORS_CODES:
      raise ConversionError(f"tensor {spec.name!r}: dtype {spec.dtype} has no safetensors code")
    header[spec.name] = {"dtype": _SAFETENSORS_CODES[spec.dtype], "shape": list(spec.shape),
                         "data_offsets": [offset, offset + spec.nbytes]}
    offset += spec.nbytes
  raw = json.dumps(header, separators=(",", ":")).encode()
  raw += b" " * (-len(raw) % 8)  # Data starts 8-byte aligned.
  return struct.pack("<Q", len(raw)) + raw


class SafetensorsStreamWriter:
  """Writes one safetensors file in the order of the header given up front, each tensor whole or in pieces along
  its first axis (a fused expert tensor of several GB expert by expert); checks every piece against the header."""

  def __init__(self, path: str, specs: Sequence[TensorSpec], metadata: Mapping[str, str] | None = None):
    self.path = path
    self._specs = list(specs)
    self._next = 0
    self._rows_written = 0  # Of the current tensor, along its first axis, when written in pieces.
    header = safetensors_header(self._specs, metadata)
    self._end = len(header) + sum(s.nbytes for s in self._specs)
    try:
      self._file = storage.open_for_writing(path)
      self._file.write(header)
    except OSError as e:
      raise ConversionError(f"{path}: cannot write: {e}") from e

  def write(self, name: str, value: np.ndarray, *, piece: bool = False) -> None:
    """Writes tensor `name` whole, or (`piece`) the next rows of it: `value` is then one or more of its rows."""
    if self._next >= len(self._specs):
      raise ConversionError(f"{self.path}: tensor {name!r} is not in this shard's header")
    spec = self._specs[self._next]
    shape = tuple(value.shape)
    expected = spec.shape[1:] if piece else spec.shape
    if piece and shape == expected:
      shape, rows = (1,) + shape, 1
    else:
      rows = shape[0] if piece and shape else 0
    if (name, shape[1:] if piece else shape, value.dtype) != (spec.name, expected, spec.dtype):
      raise ConversionError(
          f"{self.path}: tensor {name!r} {tuple(value.shape)} {value.dtype} does not match header entry"
          f" {spec.name!r} {spec.shape} {spec.dtype}"
      )
    data = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    try:
      self._file.write(data.data)
    except OSError as e:
      raise ConversionError(f"{self.path}: writing tensor {name!r} failed: {e}") from e
    if piece:
      self._rows_written += rows
      if self._rows_written > spec.shape[0]:
        raise ConversionError(f"{self.path}: tensor {name!r} got {self._rows_written} rows of {spec.shape[0]}")
      if self._rows_written < spec.shape[0]:
        return
    self._rows_written = 0
    self._next += 1

  def close(self) -> None:
    try:
      written = self._file.tell()
      self._file.close()
    except OSError as e:
      raise ConversionError(f"{self.path}: closing failed: {e}") from e
    if self._next != len(self._specs) or written != self._end:
      raise ConversionError(
          f"{self.path}: wrote {self._next} of {len(self._specs)} tensors ({written} of {self._end} bytes)"
      )

  def abort(self) -> None:
    """Closes the file of a failed write, whose directory is then removed: an error on closing (a local file is
    synced as it closes) must not hide the one that made it fail."""
    with contextlib.suppress(OSError):
      self._file.close()


def assign_shards(specs: Sequence[TensorSpec], max_shard_size: int) -> list[list[int]]:
  """Indices of consecutive tensors per shard, a new shard whenever the next would exceed `max_shard_size` (HF's
  rule: a tensor larger than the limit gets a shard of its own)."""
  shards: list[list[int]] = [[]]
  size = 0
  for i, spec in enumerate(specs):
    if shards[-1] and size + spec.nbytes > max_shard_size:
      shards.append([])
      size = 0
    shards[-1].append(i)
    size += spec.nbytes
  return shards


def shard_names(count: int) -> list[str]:
  return [SINGLE_FILE] if count == 1 else [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def index_json(specs: Sequence[TensorSpec], shard_of: Mapping[str, str]) -> dict[str, Any]:
  """model.safetensors.index.json for `specs` written into the shards `shard_of` names."""
  return {
      "metadata": {"total_parameters": sum(math.prod(s.shape) for s in specs),
                   "total_size": sum(s.nbytes for s in specs)},
      "weight_map": dict(sorted(shard_of.items())),
  }
