"""A MaxText checkpoint as a tensor source: its parameter leaves, and each layer's slice of a stacked one, read
region by region through TensorStore (converter/sources/checkpoint_reader.py), without JAX or Orbax.

Any tree MaxText 0.2.5 writes or loads holds its parameters in one subtree: a linen TrainState under
`params/params` (ours, MaxText's converter's, its trainer's with `opt_state` and `step` beside them, a params-only
checkpoint), or an NNX state whose leaves end in `value` (Tunix's `model_params`). `model_tree` finds it, for both
directions; the optimizer state and step are not tensors of the model and are left unread.

A tensor is a small frozen record (the items directory, the leaf, and the stacking positions that select one layer),
so a plan built on it pickles across processes; each process opens the stored arrays it reads once, with a chunk
cache of its own, the reads of consecutive layers then decode each stored chunk once.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from converter import storage
from converter.arrays import Shape
from converter.errors import ConversionError
from converter.checkpoint_format import layout as orbax_layout
from converter.checkpoint_format.record import ConversionRecord, SourceFacts
from converter.sources.base import Region, region_bounds, squeeze_ints

PARAMS = ("params", "params")  # Where a linen TrainState keeps the model's parameters.
EMBEDDING = ("token_embedder", "embedding")
# Chunk cache of one open stored array: a chunk that two consecutive region reads touch is decoded once. Small: a
# cache fills up to its limit whether or not a chunk is read again, and on our own checkpoints (a layer per chunk,
# chunks of at most 4 MiB) few are. Measured on a DeepSeek-V3-width checkpoint laid out unscanned -> scanned
# (docs/relayout.md): 256 MiB x 4 arrays peaked at 1.79 GiB, 32 MiB x 4 at 1.01, 16 MiB x 2 at 0.83, no cache at
# 0.82, the same CPU-s within this shared machine's noise from 32 MiB down.
READ_CACHE_BYTES = 16 << 20
_OPEN_ARRAYS = 2  # Open arrays kept per process, most recently read first; each holds its own chunk cache.


@dataclasses.dataclass(frozen=True)
class MaxTextTensor:
  """One parameter leaf of a MaxText checkpoint, or (`fixed`) the slice of it at given positions of some axes:
  one layer of a stacked leaf."""

  items_path: str
  keys: tuple[str, ...]  # Tree keys of the stored array.
  stored_shape: Shape
  stored_dtype: np.dtype
  fixed: tuple[tuple[int, int], ...] = ()  # (axis, position) of the stored array, axes increasing.
  raw_fp8: bool = False  # A native fp8 checkpoint's FP8 kernels and scales read as stored (not dequantized).

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
    return (orbax_layout.tree_metadata_path(self.items_path),)

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
  record: ConversionRecord  # What the checkpoint records of its conversion.
  tree: ModelTree  # Where its parameters are in the stored tree.
  quant_method: str | None = None  # Leaves are stored as floats; the original's format is in `record`.
  lora: dict[str, Any] | None = None  # A MaxText LoRA checkpoint merged in (lora_export.Merge.record).

  @property
  def read_cache_bytes(self) -> int:
    """The most the reads' chunk caches hold at once in each process (what `--dry_run` adds for them)."""
    return _OPEN_ARRAYS * READ_CACHE_BYTES

  @property
  def facts(self) -> SourceFacts:
    """Its leaves are floats; the original's format and any adapter merged into it are in its record."""
    return SourceFacts(quant_method=self.record.quant_method, lora_adapter=self.lora or self.record.lora_adapter,
                       original=self.record)


@dataclasses.dataclass(frozen=True)
class ModelTree:
  """The model's weights in a checkpoint's tree: by their path under a Linen TrainState's params/params (the
  family layouts' paths), each the stored leaf it is (`StoredArray.path`: the tree's own keys)."""

  where: str  # Where its weights are, for messages.
  prefix: tuple[str, ...]  # The stored keys before a weight's path (for messages about missing leaves).
  suffix: tuple[str, ...]  # And after it.
  params: dict[tuple[str, ...], Any]  # checkpoint_reader.StoredArray (or what a test reads), by path.

  def show(self, keys: Sequence[str]) -> str:
    return "/".join((*self.prefix, *keys, *self.suffix))


def linen_keys(keys: Sequence[str]) -> tuple[str, ...]:
  """Tree keys with an nnx.List's `layers/0` read as Linen's `layers_0` (MaxText's names)."""
  folded: list[str] = []
  for key in keys:
    if key.isdigit() and folded:
      folded[-1] = f"{folded[-1]}_{key}"
    else:
      folded.append(key)
  return tuple(folded)


def _is_rng_state(keys: tuple[str, ...]) -> bool:
  """An NNX RngState leaf (`.../rngs/<stream>/{key,count}/value`): the module's random streams, not a weight."""
  return len(keys) >= 4 and keys[-4] == "rngs" and keys[-2] in ("key", "count")


def model_tree(arrays: Mapping[tuple[str, ...], Any], items_path: str) -> ModelTree:
  """The weights of the checkpoint at `items_path` (`arrays`: its stored arrays by tree keys), told from its own
  tree:

  - a Linen TrainState (this converter's output, MaxText's pre-training and native SFT trainers): the arrays under
    params/params;
  - an NNX state (Tunix's CheckpointManager, `<step>/model_params`, which MaxText's Tunix-based train_sft and
    train_rl save through; MaxText's NNX loader reads it too): every Variable a `.../value` leaf, under `base/`
    where the model was wrapped (MaxText's TunixMaxTextAdapter in RL); RngState leaves (`rngs/...`) dropped, and an
    nnx.List's `layers/0` read as Linen's `layers_0`.
  Anything else is refused, naming what the tree holds."""
  params = {k[len(PARAMS):]: a for k, a in arrays.items() if k[: len(PARAMS)] == PARAMS}
  if params:
    return ModelTree("under params/params", PARAMS, (), params)
  base = ("base",) if arrays and all(k[:1] == ("base",) for k in arrays) else ()
  if arrays and all(k[-1:] == ("value",) for k in arrays):
    nnx_params = {}
    for keys, array in arrays.items():
      if not _is_rng_state(keys):
        nnx_params[linen_keys(keys[len(base):-1])] = array
    if nnx_params and all(k[-1].endswith(("_lora_a", "_lora_b")) for k in nnx_params):
      raise ConversionError(
          f"{items_path}: an NNX state of LoRA factors only (Tunix saves only those for a LoRA run): it holds no"
          " base weights to write back; pass it as --lora_checkpoint_path with the base checkpoint")
    if nnx_params:
      return ModelTree("of the NNX state (Tunix's model_params)", base, ("value",), nnx_params)
  top = sorted({k[0] for k in arrays})
  raise ConversionError(
      f"{items_path}: neither a MaxText TrainState (arrays under params/params) nor an NNX state as Tunix saves it"
      f" (<step>/model_params, every leaf .../value); its arrays are under: {', '.join(top) or 'nothing'}")


def open_maxtext(items_path: str, raw_fp8: bool = False) -> MaxTextSource:
  """The parameter leaves of the MaxText checkpoint at `items_path` (OUT/N/items), from its metadata alone. A
  native fp8 checkpoint's FP8 kernels are presented dequantized (float32, as MaxText computes with them), or with
  `raw_fp8` as stored, each beside its `<name>_scale` leaf."""
  tree = model_tree(_reader(items_path, raw_fp8).arrays, items_path)
  record = ConversionRecord.read(items_path)
  tensors = {}
  for path, array in tree.params.items():
    if array.dtype.kind not in "fV":
      raise ConversionError(f"{items_path}: leaf {'/'.join(array.path)} has dtype {array.dtype}, not a float")
    check_recorded_dtype(items_path, array, record)
    tensors["/".join(path)] = MaxTextTensor(items_path, array.path, array.shape, array.dtype, raw_fp8=raw_fp8)
  return MaxTextSource(items_path, tensors, (orbax_layout.tree_metadata_path(items_path),), record, tree)


def check_recorded_dtype(items_path: str, array: Any, record: ConversionRecord) -> None:
  """A checkpoint whose record names its save dtype stores each weight in it, in float32 (a leaf kept in float32;
  a native fp8 kernel presented dequantized, or its scales) or, where the record says FP8 was kept, in FP8. Another
  float of the same width (an array's zarr.json saying float16 where bfloat16 was written) would decode the stored
  bytes as other values, and no chunk checksum covers that."""
  dtype = array.dtype.name
  if not isinstance(record.save_dtype, str) or dtype in (record.save_dtype, "float32"):
    return
  if record.fp8 and "float8" in dtype:
    return
  raise ConversionError(f"{items_path}: leaf {'/'.join(array.path)} is stored as {dtype} (its zarr.json), but"
                        f" {orbax_layout.metadata_path(items_path)} records the checkpoint as saved in"
                        f" {record.save_dtype}")


_lock = threading.Lock()
_readers: dict[tuple[str, bool], Any] = {}
_open_arrays: collections.OrderedDict[tuple[str, tuple[str, ...], bool], Any] = collections.OrderedDict()


def _reader(items_path: str, raw_fp8: bool = False):
  from converter.sources.checkpoint_reader import CheckpointReader  # pylint: disable=g-import-not-at-top

  with _lock:
    reader = _readers.get((items_path, raw_fp8))
  if reader is None:
    reader = CheckpointReader(items_path, dequantize_fp8=not raw_fp8)
    with _lock:
      reader = _readers.setdefault((items_path, raw_fp8), reader)
  return reader


def _open(tensor: MaxTextTensor):
  """The stored array of `tensor`, opened once per process (the most recently read few stay open)."""
  key = (tensor.items_path, tensor.keys, tensor.raw_fp8)
  with _lock:
    opened = _open_arrays.get(key)
    if opened is not None:
      _open_arrays.move_to_end(key)
      return opened
  reader = _reader(tensor.items_path, tensor.raw_fp8)
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
