"""A MaxText checkpoint as a tensor source: its parameter leaves, and each layer's slice of a stacked one, read
region by region through TensorStore (converter/checkpoint_reader.py), without JAX or Orbax.

Any tree MaxText 0.2.5 writes or loads holds its parameters in one subtree: a linen TrainState under
`params/params` (ours, MaxText's converter's, its trainer's with `opt_state` and `step` beside them, a params-only
checkpoint), or an NNX state whose leaves end in `value`. `model_params` finds it; the optimizer state and step are
not tensors of the model and are left unread.

A tensor is a small frozen record (the items directory, the leaf, and the stacking positions that select one layer),
so a plan built on it pickles across processes; each process opens the stored arrays it reads once, with a chunk
cache of its own, the reads of consecutive layers then decode each stored chunk once.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any, Mapping

import numpy as np

from converter import storage
from converter.arrays import Shape
from converter.errors import ConversionError
from converter.output import layout as orbax_layout
from converter.sources.base import Region, region_bounds, squeeze_ints

TRAIN_STATE_PARAMS = ("params", "params")  # Where a linen TrainState keeps the model's parameters.
NNX_VALUE = "value"  # The last key of every NNX variable's array.
EMBEDDING = ("token_embedder", "embedding")
# Chunk cache of one open stored array: the chunks a layer's slice touches, reused by the next layer's.
READ_CACHE_BYTES = 256 << 20
_OPEN_ARRAYS = 4  # Open arrays kept per process, most recently read first; each holds its own chunk cache.


@dataclasses.dataclass(frozen=True)
class MaxTextTensor:
  """One parameter leaf of a MaxText checkpoint, or (`fixed`) the slice of it at given positions of some axes:
  one layer of a stacked leaf."""

  items_path: str
  keys: tuple[str, ...]  # Tree keys of the stored array.
  stored_shape: Shape
  stored_dtype: np.dtype
  fixed: tuple[tuple[int, int], ...] = ()  # (axis, position) of the stored array, axes increasing.

  @property
  def name(self) -> str:
    leaf = "/".join(self.keys)
    return leaf if not self.fixed else f"{leaf}[{', '.join(f'{a}={p}' for a, p in self.fixed)}]"

  @property
  def shape(self) -> Shape:
    axes = {a for a, _ in self.fixed}
    return tuple(d for axis, d in enumerate(self.stored_shape) if axis not in axes)

  @property
  def dtype(self) -> np.dtype:
    return self.stored_dtype

  @property
  def format(self) -> str:
    return f"MaxText {self.stored_dtype.name}"

  @property
  def files(self) -> tuple[str, ...]:
    return (storage.join(self.items_path, orbax_layout.TREE_METADATA),)

  @property
  def stored_names(self) -> tuple[str, ...]:
    return ("/".join(self.keys),)

  @property
  def byte_ranges(self) -> tuple[tuple[str, int, int], ...]:
    return ()  # Chunks inside OCDBT data files: TensorStore finds their ranges.

  def at(self, fixed: tuple[tuple[int, int], ...]) -> MaxTextTensor:
    """The slice at `fixed` (positions of stored axes) of this leaf."""
    return dataclasses.replace(self, fixed=tuple(sorted(self.fixed + fixed)))

  def stored_index(self, region: Region) -> tuple[Any, ...]:
    """`region` of this tensor as an index of the stored array: the fixed positions put back between its axes."""
    bounds = region_bounds(self.shape, region)
    visible = iter([*(slice(b, e) for b, e in bounds), *(slice(None) for _ in self.shape[len(bounds):])])
    fixed = dict(self.fixed)
    return tuple(fixed[axis] if axis in fixed else next(visible) for axis in range(len(self.stored_shape)))

  def read(self, dtype: np.dtype | None = None, region: Region = (), transpose: bool = False) -> np.ndarray:
    value = squeeze_ints(_open(self).read(self.stored_index(region)), region)
    value = value.astype(dtype or self.stored_dtype, copy=False)
    if transpose:
      value = np.swapaxes(value, -1, -2)
    return np.ascontiguousarray(value)


@dataclasses.dataclass(frozen=True)
class MaxTextSource:
  """A MaxText checkpoint's parameter leaves by their path below the parameter subtree ("decoder/layers/...")."""

  location: str  # The items directory.
  tensors: Mapping[str, MaxTextTensor]
  files: tuple[str, ...]
  record: Any  # converter.output.record.ConversionRecord: what the checkpoint records of its conversion.
  prefix: tuple[str, ...]  # The parameter subtree's keys (params/params, or an NNX state's).
  quant_method: str | None = None  # Leaves are stored as floats; the original's format is in `record`.
  lora: dict[str, Any] | None = None  # A MaxText LoRA checkpoint merged in (lora_export.Merge.record).

  def leaf(self, keys: tuple[str, ...]) -> MaxTextTensor | None:
    return self.tensors.get("/".join(keys))


def model_params(paths: list[tuple[str, ...]], items_path: str) -> tuple[tuple[str, ...], dict[tuple[str, ...],
                                                                                            tuple[str, ...]]]:
  """The parameter subtree's keys and its leaves (stored keys by their path below it, an NNX `value` dropped):
  the subtree holding `token_embedder/embedding`. Refuses a tree without one, naming what it holds."""
  for path in paths:
    keys = path[:-1] if path[-1] == NNX_VALUE else path
    if keys[-len(EMBEDDING):] == EMBEDDING:
      prefix = keys[:-len(EMBEDDING)]
      if prefix[-1:] == ("decoder",) or "lora" in "/".join(prefix):
        continue
      leaves = {}
      for stored in paths:
        if stored[:len(prefix)] != prefix:
          continue
        below = stored[len(prefix):]
        leaves[below[:-1] if below[-1] == NNX_VALUE else below] = stored
      return prefix, leaves
  tops = sorted({"/".join(p[:2]) for p in paths})
  raise ConversionError(f"{items_path}: no model parameters found (no token_embedder/embedding leaf in a"
                        f" TrainState's params/params or an NNX state); the tree holds {', '.join(tops[:8])}"
                        f"{' ...' if len(tops) > 8 else ''}")


def open_maxtext(items_path: str) -> MaxTextSource:
  """The parameter leaves of the MaxText checkpoint at `items_path` (OUT/N/items), from its metadata alone."""
  from converter.output.record import ConversionRecord  # pylint: disable=g-import-not-at-top

  reader = _reader(items_path)
  prefix, leaves = model_params(list(reader.arrays), items_path)
  tensors = {}
  for below, stored in leaves.items():
    array = reader.arrays[stored]
    if array.dtype.kind not in "fV":
      raise ConversionError(f"{items_path}: leaf {'/'.join(stored)} has dtype {array.dtype}, not a float")
    tensors["/".join(below)] = MaxTextTensor(items_path, stored, array.shape, array.dtype)
  return MaxTextSource(items_path, tensors, (storage.join(items_path, orbax_layout.TREE_METADATA),),
                       ConversionRecord.read(items_path), prefix)


_lock = threading.Lock()
_readers: dict[str, Any] = {}
_open_arrays: collections.OrderedDict[tuple[str, tuple[str, ...]], Any] = collections.OrderedDict()


def _reader(items_path: str):
  from converter.checkpoint_reader import CheckpointReader  # pylint: disable=g-import-not-at-top

  with _lock:
    reader = _readers.get(items_path)
  if reader is None:
    reader = CheckpointReader(items_path, dequantize_fp8=True)
    with _lock:
      reader = _readers.setdefault(items_path, reader)
  return reader


def _open(tensor: MaxTextTensor):
  """The stored array of `tensor`, opened once per process (the most recently read few stay open)."""
  key = (tensor.items_path, tensor.keys)
  with _lock:
    opened = _open_arrays.get(key)
    if opened is not None:
      _open_arrays.move_to_end(key)
      return opened
  reader = _reader(tensor.items_path)
  array = reader.arrays.get(tensor.keys)
  if array is None:
    raise ConversionError(f"{tensor.items_path}: leaf {'/'.join(tensor.keys)} is not in the checkpoint")
  slice_index = tuple(dict(tensor.fixed).get(axis, slice(None)) for axis in range(len(array.shape)))
  opened = reader.open(array, slice_index, READ_CACHE_BYTES)
  with _lock:
    opened = _open_arrays.setdefault(key, opened)
    while len(_open_arrays) > _OPEN_ARRAYS:
      _open_arrays.popitem(last=False)
  return opened
