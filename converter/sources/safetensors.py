"""The plain source: HuggingFace safetensors files, their tensors read through memory maps or, in a bucket, with
one ranged request per read (`storage.read_region`): never a copy of a whole shard.

The header is parsed here rather than by the `safetensors` package so that every tensor's dtype, shape and byte
range can be checked against the file before anything is read (a truncated download or a corrupt header is
reported with the file name, not as a crash halfway through an hour-long conversion), and so that reads are
plain memory-mapped slices with no global lock and no bfloat16 round trip through float32.

Every stored tensor is a `SourceTensor` of its own dtype; the quantized sources (fp8.py, mxfp4.py) are built on
top of these records.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Mapping

import ml_dtypes
import numpy as np

from converter import storage
from converter.arrays import transpose_last_two
from converter.checkpoint_format.record import SourceFacts
from converter.errors import ConversionError
from converter.sources.base import Region, as_slices, region_bounds, region_shape, squeeze_ints

SAFETENSORS_DTYPES: Mapping[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),  # Power-of-two block scales ("ue8m0").
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
FLOATING_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
_MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  """One stored tensor: where its bytes are, enough to read it without consulting the header again."""

  name: str
  path: str
  dtype_code: str
  shape: tuple[int, ...]
  begin: int  # Absolute byte offset in the file.
  end: int

  @property
  def dtype(self) -> np.dtype:
    return SAFETENSORS_DTYPES[self.dtype_code]

  @property
  def nbytes(self) -> int:
    return self.end - self.begin

  @property
  def format(self) -> str:
    return self.dtype_code

  @property
  def files(self) -> tuple[str, ...]:
    return (self.path,)

  @property
  def stored_names(self) -> tuple[str, ...]:
    return (self.name,)

  @property
  def byte_ranges(self) -> tuple[tuple[str, int, int], ...]:
    return ((self.path, self.begin, self.end),)

  def read(self, dtype: np.dtype | None = None, region: Region = (), transpose: bool = False) -> np.ndarray:
    """A private copy of `region` (leading-axis ints and slices), cast to `dtype` (no float32 round trip when the
    dtypes already match), from a memory map (local files) or one ranged request (buckets); `transpose` swaps
    its last two axes."""
    try:
      slices = as_slices(self.shape, region)
    except ValueError as e:
      raise ConversionError(f"{self.path}: tensor {self.name!r} {self.shape}: {e}") from e
    try:
      # Swapped while copying out of the file unless an int indexes one of the two axes (then after).
      in_copy = transpose and all(isinstance(i, slice) for i in region[len(self.shape) - 2:])
      copy = storage.read_region(self.path, self.begin, self.dtype, self.shape, slices, self._byte_span(region),
                                 dtype if dtype is not None else self.dtype, transpose=in_copy)
    except (OSError, ValueError) as e:
      raise ConversionError(f"{self.path}: cannot read tensor {self.name!r}: {e}") from e
    value = squeeze_ints(copy, region)
    return transpose_last_two(value) if transpose and not in_copy else value

  def _byte_span(self, region: Region) -> tuple[int, int]:
    """Absolute offsets of the first and one past the last byte `region` touches."""
    if not self.shape:
      return self.begin, self.end
    if 0 in region_shape(self.shape, region) or 0 in self.shape:
      return self.begin, self.begin
    bounds = region_bounds(self.shape, region)
    first = [start for start, _ in bounds] + [0] * (len(self.shape) - len(bounds))
    last = [stop - 1 for _, stop in bounds] + [d - 1 for d in self.shape[len(bounds):]]
    itemsize = self.dtype.itemsize
    flat = lambda index: int(np.ravel_multi_index(index, self.shape)) * itemsize
    return self.begin + flat(first), self.begin + flat(last) + itemsize


def read_header(path: str) -> dict[str, TensorInfo]:
  """Parses and validates one safetensors file's header; raises ConversionError naming the file."""
  try:
    file_size = storage.size(path)
    prefix = storage.read_bytes(path, 0, min(8, file_size))
    if len(prefix) < 8:
      raise ConversionError(f"{path}: not a safetensors file (only {len(prefix)} bytes)")
    (header_len,) = struct.unpack("<Q", prefix)
    if header_len <= 0 or header_len > min(_MAX_HEADER_BYTES, file_size - 8):
      raise ConversionError(
          f"{path}: corrupt safetensors header (declares {header_len} header bytes, file has {file_size})"
      )
    raw = storage.read_bytes(path, 8, 8 + header_len)
  except OSError as e:
    raise ConversionError(f"{path}: cannot read: {e}") from e
  try:
    header = json.loads(raw)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ConversionError(f"{path}: corrupt safetensors header (not valid JSON: {e})") from e
  if not isinstance(header, dict):
    raise ConversionError(f"{path}: corrupt safetensors header (not a JSON object)")
  data_start = 8 + header_len
  tensors = {}
  for name, entry in header.items():
    if name == "__metadata__":
      continue
    try:
      dtype_code = entry["dtype"]
      shape = tuple(int(d) for d in entry["shape"])
      begin, end = (int(o) for o in entry["data_offsets"])
    except (KeyError, TypeError, ValueError) as e:
      raise ConversionError(f"{path}: corrupt safetensors header entry for tensor {name!r}: {entry!r}") from e
    if dtype_code not in SAFETENSORS_DTYPES:
      raise ConversionError(f"{path}: tensor {name!r} has unknown dtype {dtype_code!r}")
    expected = int(np.prod(shape, dtype=np.int64)) * SAFETENSORS_DTYPES[dtype_code].itemsize
    if end - begin != expected or begin < 0:
      raise ConversionError(
          f"{path}: tensor {name!r}: header byte range {begin}..{end} does not fit shape {shape} {dtype_code}"
      )
    if data_start + end > file_size:
      raise ConversionError(
          f"{path}: truncated file: tensor {name!r} ends at byte {data_start + end}, file has {file_size} bytes"
      )
    tensors[name] = TensorInfo(name, path, dtype_code, shape, data_start + begin, data_start + end)
  return tensors


@dataclasses.dataclass(frozen=True)
class SafetensorsSource:
  """Every stored tensor of a checkpoint directory (single file or sharded index), by name, as stored."""

  location: str
  tensors: Mapping[str, TensorInfo]

  quant_method = None
  facts = SourceFacts()
  read_cache_bytes = 0

  @property
  def files(self) -> list[str]:
    return sorted({t.path for t in self.tensors.values()})


def _index_shards(directory: str, index_path: str) -> tuple[list[str], dict[str, str]]:
  try:
    weight_map = json.loads(storage.read_text(index_path))["weight_map"]
  except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
    raise ConversionError(f"{index_path}: unreadable safetensors index ({type(e).__name__}: {e})") from e
  shards = sorted(set(weight_map.values()))
  for shard in shards:
    if not storage.is_file(storage.join(directory, shard)):
      names = sorted(n for n, s in weight_map.items() if s == shard)
      raise ConversionError(
          f"{index_path}: names shard {shard!r}, which does not exist (it should hold {len(names)} tensors,"
          f" e.g. {names[0]!r})"
      )
  return shards, weight_map


def open_safetensors(directory: str) -> SafetensorsSource:
  """Opens `model.safetensors` or the shards of `model.safetensors.index.json` in `directory`."""
  index_path = storage.join(directory, "model.safetensors.index.json")
  single_path = storage.join(directory, "model.safetensors")
  tensors: dict[str, TensorInfo] = {}
  if storage.is_file(index_path):
    shards, weight_map = _index_shards(directory, index_path)
    for shard in shards:
      for name, info in read_header(storage.join(directory, shard)).items():
        if name in tensors:
          raise ConversionError(f"{info.path}: tensor {name!r} also appears in {tensors[name].path}")
        tensors[name] = info
    for name, shard in weight_map.items():
      if name not in tensors:
        raise ConversionError(f"{index_path}: tensor {name!r} is listed in shard {shard!r} but not stored there")
  elif storage.is_file(single_path):
    tensors = read_header(single_path)
  else:
    raise ConversionError(
        f"{directory}: no model.safetensors or model.safetensors.index.json (only safetensors checkpoints are"
        " supported)"
    )
  return SafetensorsSource(directory, tensors)
