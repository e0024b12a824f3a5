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

import concurrent.futures
import dataclasses
import math
import struct
from typing import Any, Callable, Mapping

import ml_dtypes
import numpy as np

from converter import json_input, storage
from converter.arrays import Shape, transpose_last_two
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
_INT64_LIMIT = 1 << 63  # Shapes and offsets go through numpy, whose sizes are int64.
_MAX_RANK = 64  # numpy's most dimensions.


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
  header = json_input.parse(raw, path, "corrupt safetensors header")
  if not isinstance(header, dict):
    raise ConversionError(f"{path}: corrupt safetensors header (not a JSON object but {json_input.type_name(header)})")
  metadata = header.get("__metadata__", {})
  if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
    raise ConversionError(f"{path}: corrupt safetensors header (__metadata__ must map names to strings, got"
                          f" {_shown(metadata)})")
  data_start = 8 + header_len
  tensors = {}
  for name, entry in header.items():
    if name == "__metadata__":
      continue
    dtype_code, shape, (begin, end) = _entry(path, name, entry)
    if math.prod(shape) * SAFETENSORS_DTYPES[dtype_code].itemsize != end - begin:
      raise ConversionError(
          f"{path}: tensor {name!r}: header byte range {begin}..{end} does not fit shape {shape} {dtype_code}"
      )
    if data_start + end > file_size:
      raise ConversionError(
          f"{path}: truncated file: tensor {name!r} ends at byte {data_start + end}, file has {file_size} bytes"
      )
    tensors[name] = TensorInfo(name, path, dtype_code, shape, data_start + begin, data_start + end)
  return tensors


def _entry(path: str, name: str, entry: Any) -> tuple[str, Shape, tuple[int, int]]:
  """A header entry's dtype, shape and data offsets, each of the type and range the format allows: a dtype this
  converter knows, dimensions and offsets non-negative integers (numpy's int64 holds every element count), and
  the offsets in order."""
  if not isinstance(entry, dict):
    raise ConversionError(f"{path}: corrupt safetensors header entry for tensor {name!r}: {_shown(entry)}")
  dtype_code, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
  if not isinstance(dtype_code, str) or dtype_code not in SAFETENSORS_DTYPES:
    raise ConversionError(f"{path}: tensor {name!r} has unknown dtype {_shown(dtype_code)}")
  if (not isinstance(shape, list) or len(shape) > _MAX_RANK or
      not all(json_input.is_int(d) and 0 <= d < _INT64_LIMIT for d in shape)):
    raise ConversionError(f"{path}: tensor {name!r}: shape {_shown(shape)} is not a list of at most {_MAX_RANK}"
                          " non-negative integers")
  if math.prod(shape) >= _INT64_LIMIT:
    raise ConversionError(f"{path}: tensor {name!r}: shape {shape} has more elements than any file holds")
  if (not isinstance(offsets, list) or len(offsets) != 2 or
      not all(json_input.is_int(o) and 0 <= o < _INT64_LIMIT for o in offsets) or offsets[0] > offsets[1]):
    raise ConversionError(f"{path}: tensor {name!r}: data_offsets {_shown(offsets)} are not two non-negative"
                          " integers in order")
  return dtype_code, tuple(shape), (offsets[0], offsets[1])


def _shown(value: Any) -> str:
  """`value` for a message, cut short: a hostile header may hold megabytes in one entry."""
  text = repr(value)
  return text if len(text) <= 80 else text[:77] + "..."


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


def index_weight_map(index: Any, index_path: str) -> dict[str, str]:
  """The `weight_map` of a parsed safetensors index (tensor name -> shard file), refused unless it is an object
  naming at least one tensor, each in a file beside the index (a plain relative name: not absolute, no `..`)."""
  weight_map = index.get("weight_map") if isinstance(index, dict) else None
  if not isinstance(weight_map, dict):
    found = "no weight_map" if not isinstance(index, dict) or "weight_map" not in index else (
        f"a weight_map that is {json_input.type_name(weight_map)}")
    raise ConversionError(f"{index_path}: unreadable safetensors index ({found}; expected an object mapping each"
                          " tensor to its shard file)")
  if not weight_map:
    raise ConversionError(f"{index_path}: the index lists no tensors (its weight_map is empty)")
  for name, shard in weight_map.items():
    if not isinstance(shard, str) or not _is_file_name(shard):
      raise ConversionError(f"{index_path}: weight_map puts tensor {name!r} in {_shown(shard)}, which is not the name"
                            " of a file beside the index")
  return weight_map


def _is_file_name(name: str) -> bool:
  """A relative path that stays inside its directory and names something in it."""
  parts = name.split("/")
  return bool(name) and "\\" not in name and not name.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def _each_shard(fn: Callable[[str], Any], shards: list[str]) -> list[Any]:
  """`fn` of every shard, in order, several at a time: on a bucket or the Hub each is a round trip or three."""
  if len(shards) <= 1:
    return [fn(shard) for shard in shards]
  with concurrent.futures.ThreadPoolExecutor(min(16, len(shards)), thread_name_prefix="hf2maxtext-header") as pool:
    return list(pool.map(fn, shards))


def _index_shards(directory: str, index_path: str) -> tuple[list[str], dict[str, str]]:
  weight_map = index_weight_map(json_input.read(index_path, "unreadable safetensors index"), index_path)
  shards = sorted(set(weight_map.values()))
  found = _each_shard(lambda shard: storage.is_file(storage.join(directory, shard)), shards)
  for shard, is_file in zip(shards, found):
    if not is_file:
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
    for header in _each_shard(lambda shard: read_header(storage.join(directory, shard)), shards):
      for name, info in header.items():
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
