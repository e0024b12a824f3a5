"""Reads slices of the arrays in an Orbax checkpoint, one at a time, without restoring any whole leaf.

The only module of the MaxText -> HF direction that talks to TensorStore. Orbax's restore APIs
materialise whole leaves (or whole device shards of a sharding one must build), so instead each stored array is
opened as a TensorStore through the read spec Orbax itself uses (`NumpyHandler.deserialize` ->
`build_array_read_spec`), rebuilt by converter/sources/orbax_format.py without importing Orbax, and indexed. This reads
checkpoints whose leaves were saved as np.ndarray (1 device) and as sharded jax.Array (N devices) alike: the
on-disk array is the same zarr3 array in OCDBT either way, only its chunking differs.

What a slice read costs: TensorStore decodes whole chunks (each is one zstd blob), so reading one layer of a
stacked leaf decodes every chunk that layer touches, and a chunk usually spans every layer: Orbax chunks a
sharded leaf by device shard, and by default writes a numpy leaf as one chunk for the whole leaf. So each open
array gets its own chunk cache, large enough for at least one chunk and, up to a limit (1 GiB by default), for
all the chunks one slice touches: then consecutive slices decode each chunk once instead of once per slice
(measured on a 402 MB bfloat16 leaf read as 384 slices: 0.5-0.6 s instead of 6-133 s without a cache). When the
chunks one slice touches exceed the limit, every slice decodes them again: correct and bounded in memory, but
slow. A chunk larger than the limit is still cached: TensorStore holds it whole while decoding anyway.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np
from absl import logging
import tensorstore as ts

from converter.arrays import Shape
from converter import storage
from converter.sources import orbax_format
from converter.errors import ConversionError

Index = tuple[Any, ...]  # ints and slices, as numpy takes them.
# The most one read asks TensorStore for at once (`OpenArray._read_in_pieces`). Measured on a re-layout at Kimi
# K2.6's widths, random values (docs/relayout.md): whole blocks 858 MiB, 4 MiB pieces 802-811, 1 MiB 639-667.
READ_PIECE_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class StoredArray:
  """One array leaf of the checkpoint, from its metadata: nothing is read."""

  path: tuple[str, ...]  # Tree keys, e.g. ("params", "params", "decoder", "layers", "mlp", "wo", "kernel").
  name: str  # Orbax's parameter name: the keys joined with ".".
  shape: Shape
  dtype: np.dtype
  # A native fp8 kernel presented dequantized (dtype float32): its stored FP8 leaf and its `_scale` sibling.
  fp8: tuple["StoredArray", "StoredArray"] | None = None

  @property
  def nbytes(self) -> int:
    return math.prod(self.shape) * self.dtype.itemsize


class OpenFp8Array:
  """A native fp8 kernel read dequantized as MaxText does (`dequantize_weight`): each scale value times the d / s
  consecutive elements it covers on each axis, in float32; only the scales a slice covers are read."""

  def __init__(self, values: "OpenArray", scales: "OpenArray"):
    self.array = values.array
    self._values, self._scales = values, scales

  def read(self, index: Index) -> np.ndarray:
    shape, scale_shape = self._values.array.shape, self._scales.array.shape
    full = tuple(index) + (slice(None),) * (len(shape) - len(index))
    scale_index, crops = [], []
    for i, d, s in zip(full, shape, scale_shape):
      per = d // s
      if isinstance(i, slice):
        start, stop, step = i.indices(d)
        if step != 1:
          raise ValueError(f"fp8 leaf reads take step-1 slices, not {index}")
        scale_index.append(slice(start // per, -(-stop // per)))
        crops.append((per, slice(start % per, start % per + stop - start)))
      else:
        scale_index.append(int(i) // per)
    values = self._values.read(full).astype(np.float32)
    scales = self._scales.read(tuple(scale_index)).astype(np.float32)
    for axis, (per, crop) in enumerate(crops):
      scales = np.repeat(scales, per, axis=axis)[(slice(None),) * axis + (crop,)]
    return values * scales


class OpenArray:
  """A stored array opened for slice reads, with a chunk cache of its own (freed with this object)."""

  def __init__(self, reader: "CheckpointReader", array: StoredArray, store: Any):
    self.array = array
    self._reader = reader
    self._store = store
    # The order the stored chunks' elements lie in (C order unless the writer kept its sources' layout).
    self._inner_order = tuple(store.chunk_layout.inner_order or range(len(array.shape)))

  def read(self, index: Index) -> np.ndarray:
    """`array[index]` as a fresh ndarray laid out as the stored chunks' elements are (C order unless the writer
    kept its sources' layout, handlers/_orbax_private.with_inner_chunks): copied out of each chunk in memory
    order, and the way back's inverse transposes are then views. Only the chunks `index` touches are read."""
    order = _kept_order(self._inner_order, index, len(self.array.shape))
    try:
      value = self._read_in_pieces(tuple(index) + (slice(None),) * (len(self.array.shape) - len(index)), order)
    except Exception as e:  # TensorStore raises ValueError / RuntimeError with its own status text.
      self._reader.refuse_missing_files()
      raise ConversionError(
          f"{self._reader.items_path}: reading leaf {'/'.join(self.array.path)} at {_show(index)} failed: {e}"
      ) from e
    return value if order is None else np.transpose(value, np.argsort(order))

  def _read_in_pieces(self, index: Index, order: list[int] | None) -> np.ndarray:
    """`array[index]` in stored element order (`order`: the kept axes' order, None for C order), read a few
    stored chunks at a time along the first axis whose extent spans several, the next piece read while the last
    is copied into the result.

    TensorStore reads every chunk a read touches at once, each into a buffer of its own, and copies them into the
    result as they arrive: read whole, a block held its stored bytes twice, and every block being read at once
    (docs/relayout.md, the re-layout on random values). Pieces bound that to about two pieces.
    """
    kept = [axis for axis, i in enumerate(index) if isinstance(i, slice)]
    bounds = {axis: index[axis].indices(self.array.shape[axis])[:2] for axis in kept}
    chunk = self._reader.chunk_shape(self.array)
    extents = [end - begin for begin, end in bounds.values()]
    nbytes = math.prod(extents) * self.array.dtype.itemsize
    axis = next((a for a in kept if bounds[a][1] - bounds[a][0] > chunk[a]), None)
    read = lambda at: (self._store[at] if order is None else self._store[at][ts.d[order].transpose[:]]).read()
    if axis is None or nbytes <= READ_PIECE_BYTES:
      return np.ascontiguousarray(read(index).result())
    begin, end = bounds[axis]
    rows = max(1, READ_PIECE_BYTES * (end - begin) // nbytes // chunk[axis]) * chunk[axis]
    cuts = [begin, *range((begin // rows + 1) * rows, end, rows), end]
    position = kept.index(axis) if order is None else order.index(kept.index(axis))
    shape = extents if order is None else [extents[o] for o in order]
    out = np.empty(shape, dtype=self.array.dtype)
    piece = lambda lo, hi: read(index[:axis] + (slice(lo, hi),) + index[axis + 1:])
    pending = piece(cuts[0], cuts[1])
    for lo, hi, after in zip(cuts, cuts[1:], [*cuts[2:], None]):
      following = piece(hi, after) if after is not None else None
      out[(slice(None),) * position + (slice(lo - begin, hi - begin),)] = pending.result()
      pending = following
    return out


def _kept_order(inner_order: Sequence[int], index: Index, rank: int) -> list[int] | None:
  """The stored element order of the dimensions `index` keeps (those it slices), renumbered as the read's; None
  where that is C order."""
  kept = [axis for axis in range(rank) if axis >= len(index) or not isinstance(index[axis], (int, np.integer))]
  order = [kept.index(axis) for axis in inner_order if axis in kept]
  return None if order == sorted(order) else order


def _show(index: Index) -> str:
  return "[" + ", ".join(":" if isinstance(i, slice) else str(i) for i in index) + "]"


def _missing_ocdbt_files(items_path: str) -> list[str]:
  """The files (relative to `items_path`) that the OCDBT database there refers to and that do not exist."""
  directory = storage.kvstore_spec(items_path)
  kvstore = ts.KvStore.open({**directory, "path": directory["path"].rstrip("/") + "/"}).result()
  manifest = ts.ocdbt.dump(kvstore).result()
  pending = [version["root"]["location"] for version in manifest.get("versions", [])[-1:] if "root" in version]
  referenced, missing = set(), []
  while pending:
    location = pending.pop()
    kind, base, relative = location.split(":")[:3]
    name = base + relative
    if name not in referenced:
      referenced.add(name)
      if not storage.exists(storage.join(items_path, name)):
        missing.append(name)
        continue
    if kind == "btreenode":
      node = ts.ocdbt.dump(kvstore, location).result()
      for entry in node.get("entries", []):
        pending.extend(v for v in entry.values() if isinstance(v, str) and v.startswith(("value:", "btreenode:")))
  return sorted(missing)


def cache_bytes(array: StoredArray, chunk: Shape, slice_index: Index, limit: int) -> int:
  """Chunk cache for reads of `array` shaped like `slice_index`: one chunk at least, and up to `limit` all the
  chunks one such read touches (so that consecutive slices decode each chunk once)."""
  chunk_bytes = math.prod(chunk) * array.dtype.itemsize
  working_set = chunk_bytes * _chunks_touched(array.shape, chunk, slice_index)
  cache = max(chunk_bytes, min(working_set, limit))
  return cache + cache // 8 + (1 << 20)  # Headroom: TensorStore counts its own bookkeeping against the limit.


def _chunks_touched(shape: Shape, chunk: Shape, index: Index) -> int:
  """How many chunks `array[index]` intersects, for an index of ints and step-1 slices."""
  count = 1
  for axis, (size, extent) in enumerate(zip(shape, chunk)):
    extent = max(extent, 1)
    if axis < len(index) and not isinstance(index[axis], slice):
      continue
    start, stop, _ = index[axis].indices(size) if axis < len(index) else (0, size, 1)
    if stop > start:
      count *= (stop - 1) // extent - start // extent + 1
  return count


class CheckpointReader:
  """The array leaves of `items_path` (an Orbax PyTree checkpoint, e.g. OUT/0/items), for slice reads;
  `dequantize_fp8` presents each FP8 leaf with a `<name>_scale` sibling (a native fp8 model) as the float32 array
  it encodes, and hides the scales."""

  def __init__(self, items_path: str, dequantize_fp8: bool = False):
    self.items_path = items_path
    self._layout = orbax_format.read_tree_layout(items_path)
    self._probe_context = self._context(0)
    self._chunk_shapes: dict[tuple[str, ...], Shape] = {}
    self._block_shapes: dict[tuple[str, ...], Shape] = {}
    self.arrays: dict[tuple[str, ...], StoredArray] = {}
    opening = [(path, self._open_store_async(path, self._probe_context))  # All in flight at once.
               for path in self._layout.array_paths]
    for path, future in opening:
      store = self._opened(path, future)
      if store.rank:  # The scalar step, stored as an array by older writers, is not a weight.
        self.arrays[path] = StoredArray(path, orbax_format.param_name(path), tuple(int(d) for d in store.shape),
                                        np.dtype(store.dtype.numpy_dtype))
        self._chunk_shapes[path] = tuple(int(d) for d in store.chunk_layout.read_chunk.shape)
        self._block_shapes[path] = tuple(int(d) for d in store.chunk_layout.write_chunk.shape)
    if dequantize_fp8:
      self._present_fp8_dequantized()

  def _present_fp8_dequantized(self) -> None:
    for key, array in list(self.arrays.items()):
      scale = self.arrays.get(key[:-1] + (key[-1] + "_scale",))
      if scale is None or "float8" not in array.dtype.name:
        continue
      if len(scale.shape) != len(array.shape) or any(d % s for d, s in zip(array.shape, scale.shape)):
        raise ConversionError(f"{self.items_path}: fp8 leaf {'/'.join(key)} {array.shape} has scales"
                              f" {scale.shape}, which do not divide it axis by axis")
      self.arrays[key] = dataclasses.replace(array, dtype=np.dtype(np.float32), fp8=(array, scale))
      del self.arrays[scale.path]

  def open(self, array: StoredArray, slice_index: Index, cache_limit: int) -> OpenArray | OpenFp8Array:
    """Opens `array` for reads shaped like `slice_index`, with a chunk cache sized as the module docstring says."""
    if array.fp8 is not None:
      values, scales = array.fp8
      scale_index = tuple(i if isinstance(i, slice) else 0 for i in slice_index)
      return OpenFp8Array(self.open(values, slice_index, cache_limit), self.open(scales, scale_index, cache_limit))
    chunk = self.chunk_shape(array)
    touched = _chunks_touched(array.shape, chunk, slice_index)
    several_slices = any(not isinstance(i, slice) for i in slice_index)
    if several_slices and touched > 1 and touched * math.prod(chunk) * array.dtype.itemsize > cache_limit:
      logging.warning("leaf %s: one slice spans %d chunks of shape %s, more than the %d-byte read cache holds:"
                      " every slice decodes them again (slow, not wrong)", "/".join(array.path), touched, chunk,
                      cache_limit)
    store = self._open_store(array, self._context(cache_bytes(array, chunk, slice_index, cache_limit)))
    if tuple(store.shape) != array.shape or np.dtype(store.dtype.numpy_dtype) != array.dtype:
      raise ConversionError(
          f"{self.items_path}: leaf {'/'.join(array.path)} is stored as {tuple(store.shape)}"
          f" {store.dtype.numpy_dtype}, but _METADATA says {array.shape} {array.dtype}"
      )
    return OpenArray(self, array, store)

  def chunk_shape(self, array: StoredArray) -> Shape:
    """The shape of the chunks `array` is stored (and decoded) in; of its FP8 values for a dequantized leaf."""
    if array.fp8 is not None:
      return self.chunk_shape(array.fp8[0])
    return self._chunk_shapes[array.path]

  def block_shape(self, array: StoredArray) -> Shape:
    """The shape of the blocks `array` is stored in (zarr3 shards: one stored value each, its chunks inside)."""
    if array.fp8 is not None:
      return self.block_shape(array.fp8[0])
    return self._block_shapes[array.path]

  def chunk_codecs(self, array: StoredArray) -> list[dict]:
    """The zarr3 codecs each stored chunk of `array` is encoded with (inside the sharding codec, where one holds
    the chunks; empty for zarr v2)."""
    if array.fp8 is not None:
      return self.chunk_codecs(array.fp8[0])
    codecs = self._open_store(array, self._probe_context).spec().to_json().get("metadata", {}).get("codecs", [])
    sharding = [codec for codec in codecs if codec["name"] == "sharding_indexed"]  # After a transpose, if any.
    return sharding[0]["configuration"]["codecs"] if sharding else codecs

  def chunk_checksum(self, array: StoredArray) -> str | None:
    """What checks each stored chunk of `array` when it is read: "zstd" (its frames' content checksum) or
    "crc32c" (a codec in the chunk's chain), as this converter writes them; None where nothing does (older
    checkpoints, MaxText's own, zarr v2)."""
    for codec in self.chunk_codecs(array):
      if codec["name"] == "crc32c" or (codec["name"] == "zstd" and codec.get("configuration", {}).get("checksum")):
        return codec["name"]
    return None

  def first_chunk(self, array: StoredArray, index: Index) -> tuple[int, ...]:
    """Grid coordinates of the first stored chunk `array[index]` touches (ints and step-1 slices)."""
    full = tuple(index) + (slice(None),) * (len(array.shape) - len(index))
    return tuple((i.indices(size)[0] if isinstance(i, slice) else int(i)) // max(extent, 1)
                 for i, size, extent in zip(full, array.shape, self.chunk_shape(array)))

  def _open_store(self, array: StoredArray, context: ts.Context) -> Any:
    """`array` opened through the read spec Orbax itself uses, with `context`'s chunk cache."""
    return self._opened(array.path, self._open_store_async(array.path, context))

  def _open_store_async(self, path: tuple[str, ...], context: ts.Context) -> Any:
    layout = self._layout
    spec = orbax_format.array_read_spec(self.items_path, orbax_format.param_name(path), layout.use_zarr3,
                                        layout.use_ocdbt)
    return ts.open(spec, open=True, context=context)

  def _opened(self, path: tuple[str, ...], future: Any) -> Any:
    try:
      return future.result()
    except Exception as e:  # TensorStore raises ValueError / RuntimeError with its own status text.
      self.refuse_missing_files()
      raise ConversionError(f"{self.items_path}: cannot open leaf {'/'.join(path)}: {e}") from e

  def refuse_missing_files(self) -> None:
    """After a failed open or read: refuses the checkpoint naming the files its OCDBT database refers to (B-tree
    nodes, each process's data files) that are not there, if any; a walk of the whole tree, so only on failure."""
    if not self._layout.use_ocdbt:
      return
    try:
      missing = _missing_ocdbt_files(self.items_path)
    except Exception:  # pylint: disable=broad-except  (the database is unreadable in another way: say that instead)
      return
    if missing:
      shown = ", ".join(storage.join(self.items_path, name) for name in missing[:3])
      raise ConversionError(f"{self.items_path}: {len(missing)} file(s) of the checkpoint's OCDBT database are"
                            f" missing: {shown}{' ...' if len(missing) > 3 else ''} (its manifest refers to them: a"
                            " copy that left them behind, or a process's database deleted)")

  def _context(self, cache_bytes: int) -> ts.Context:
    spec: dict[str, Any] = {"file_io_concurrency": {"limit": 128}, "cache_pool": {"total_bytes_limit": cache_bytes},
                            **storage.tensorstore_resources()}
    if self._layout.use_ocdbt:
      spec["cache_pool#ocdbt"] = {"total_bytes_limit": 100_000_000}  # B-tree nodes, as Orbax's own reads do.
    return ts.Context(spec)

