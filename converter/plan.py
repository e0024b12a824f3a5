"""Turns a family's layout and a checkpoint's tensor source into the full list of output leaves.

Everything that can be checked without reading weights is checked here (every tensor present, every shape as
`config.json` implies, nothing left over, dtypes convertible), so a bad input fails before the first byte is
written. The plan's leaves carry picklable loaders; nothing is read until a loader is called, and then only
through the source, which dequantizes whatever the checkpoint stores quantized.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Iterator

import numpy as np

from converter import families
from converter import native_fp8
from converter import ops as ops_lib
from converter.arrays import assign
from converter.errors import ConversionError
from converter.families import Family, Layout, Param, ResolvedModel
from converter.families.runtime import Runtime
from converter.model_config import ModelConfig
from converter.native_fp8 import Fp8Output
from converter.ops import Op, output_shape
from converter.sources import FLOATING, SourceTensor, TensorSource

Shape = tuple[int, ...]

ROW_BLOCK_BYTES = 16 << 20  # Kept under glibc's mmap threshold, as the write blocks (handlers/streaming.py).
_ELEMENTWISE = (ops_lib.ScaleInFloat32, ops_lib.AddInFloat32)
_WITHIN_HEAD = (*_ELEMENTWISE, ops_lib.InterleaveRope)


def _row_preserving(op: Op, ndim: int) -> bool:
  """Whether `op` maps each row of a 2-D tensor to the same row of its output."""
  return isinstance(op, _ELEMENTWISE) or (isinstance(op, ops_lib.Slot) and op.axis % ndim != 0)


@dataclasses.dataclass(frozen=True)
class Slabs:
  """How a run of the source tensor's rows converts on its own: source rows `unit * i` to `unit * (i + 1)` make
  index i of the output's `axis`."""

  axis: int
  unit: int


def row_slabs(ops: tuple[Op, ...], part_shape: Shape) -> Slabs | None:
  """The output axis along the source's rows, when a slab of rows converts on its own; None otherwise.

  The largest single tensors are embeddings and logits kernels (Qwen3's 151936-row tables, 1.2 GB each),
  attention projections (Llama 3 405B's q_proj: 537 MB; DeepSeek V3's o_proj: 235 MB) and one expert of a fused
  expert tensor (Llama 4 Maverick: 168 MB): reading them a slab of rows at a time keeps every block, and so the
  memory a save needs, small. Rows stay rows (embeddings, fused experts split along their columns), become
  columns (logits kernels, MLP kernels), whole heads (q/k/v kernels: (H*D, E) -> (E, H, D)) or the last axis
  (output kernels: (E, H*D) -> (H, D, E)).
  """
  if len(part_shape) != 2:
    return None
  if all(_row_preserving(op, 2) or isinstance(op, ops_lib.PadRows) for op in ops):
    return Slabs(0, 1)
  if not ops or not isinstance(ops[0], ops_lib.Transpose):
    return None
  rest = ops[1:]
  if all(isinstance(op, (*_ELEMENTWISE, ops_lib.PadColumns)) for op in rest):
    return Slabs(1, 1)
  if not isinstance(rest[0], ops_lib.Reshape) or not all(isinstance(op, _WITHIN_HEAD) for op in rest[1:]):
    return None
  rows, columns = part_shape
  heads = rest[0].new_shape
  if len(heads) == 3 and heads[0] == columns:  # (H*D, E) -> (E, H*D) -> (E, H, D): rows are whole heads.
    return Slabs(1, heads[2])
  if heads[-1] == rows and not rest[1:]:  # (E, H*D) -> (H*D, E) -> (H, D, E): rows are the last axis.
    return Slabs(len(heads) - 1, 1)
  return None


def slab_ops(ops: tuple[Op, ...], slabs: Slabs, count: int) -> tuple[Op, ...]:
  """`ops` for a slab of `count` indices of `slabs.axis`: the shape-dependent ones resized."""
  resized = []
  for op in ops:
    if isinstance(op, ops_lib.PadRows):
      op = ops_lib.PadRows(count)
    elif isinstance(op, ops_lib.PadColumns):
      op = ops_lib.PadColumns(count)
    elif isinstance(op, ops_lib.Reshape):
      op = ops_lib.Reshape(op.new_shape[: slabs.axis] + (count,) + op.new_shape[slabs.axis + 1 :])
    resized.append(op)
  return tuple(resized)


@dataclasses.dataclass(frozen=True)
class FromTensor:
  """Loader: one source tensor (or one expert's slice of it, `lead`), read in the save dtype, then the family's
  ops; large ones a slab of rows at a time (see `row_slabs`)."""

  tensor: SourceTensor
  lead: tuple[int, ...]
  ops: tuple[Op, ...]
  dtype: np.dtype
  shape: Shape

  @property
  def _part_shape(self) -> Shape:
    return tuple(self.tensor.shape[len(self.lead):])

  @property
  def _slabs(self) -> Slabs | None:
    if math.prod(self.shape) * self.dtype.itemsize <= ROW_BLOCK_BYTES:
      return None
    return row_slabs(self.ops, self._part_shape)

  @property
  def block_shape(self) -> Shape:
    slabs = self._slabs
    if slabs is None:
      return self.shape
    index_bytes = math.prod(self.shape) // self.shape[slabs.axis] * self.dtype.itemsize
    block = list(self.shape)
    block[slabs.axis] = max(1, ROW_BLOCK_BYTES // index_bytes)
    return tuple(block)

  def _read(self, region: tuple, ops: tuple[Op, ...]) -> np.ndarray:
    """The source region with `ops` applied; a leading 2-D transpose is done by the source as it copies."""
    transpose = bool(ops) and isinstance(ops[0], ops_lib.Transpose) and len(self._part_shape) == 2
    x = self.tensor.read(self.dtype, region, transpose=transpose)  # A private copy: the ops never see the map.
    for op in ops[1:] if transpose else ops:
      x = op(x)
    return x

  def __call__(self) -> np.ndarray:
    return self._read(self.lead, self.ops)

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    slabs = self._slabs
    if slabs is None:
      return self()[index]
    start, stop, _ = index[slabs.axis].indices(self.shape[slabs.axis])
    stored = self._part_shape[0]  # Rows past the stored ones are padding (a vocabulary padded for MaxText).
    rows = slice(min(start * slabs.unit, stored), min(stop * slabs.unit, stored))
    x = self._read(self.lead + (rows,), slab_ops(self.ops, slabs, stop - start))
    return x[tuple(slice(None) if axis == slabs.axis else s for axis, s in enumerate(index))]


@dataclasses.dataclass(frozen=True)
class Stack:
  """Loader: parts stacked on a new `axis`; a region loads only the parts it spans."""

  parts: tuple[Any, ...]
  axis: int
  shape: Shape
  dtype: np.dtype

  @property
  def block_shape(self) -> Shape:
    part_block = tuple(self.parts[0].block_shape)
    return part_block[: self.axis] + (1,) + part_block[self.axis :]

  def __call__(self) -> np.ndarray:
    return self.region(tuple(slice(0, d) for d in self.shape))

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    along = index[self.axis]
    part_index = index[: self.axis] + index[self.axis + 1 :]
    ks = range(*along.indices(self.shape[self.axis]))
    out_shape = tuple(len(range(*s.indices(d))) for s, d in zip(index, self.shape))
    out = np.empty(out_shape, dtype=self.dtype)
    for j, k in enumerate(ks):
      assign(out[(slice(None),) * self.axis + (j,)], self.parts[k].region(part_index))
    return out


@dataclasses.dataclass(frozen=True)
class JoinSlots:
  """Loader: several params' values, each written into its slot of one value (a packed projection)."""

  parts: tuple[tuple[Any, ops_lib.Slot], ...]
  shape: Shape
  dtype: np.dtype

  @property
  def block_shape(self) -> Shape:
    return self.shape

  def __call__(self) -> np.ndarray:
    out = np.empty(self.shape, self.dtype)
    for loader, slot in self.parts:
      slot.place(out, loader())
    return out

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    return self()[index]


def source_tensors(loader: Any) -> Iterator[SourceTensor]:
  """Every source tensor a leaf's loader reads."""
  if isinstance(loader, FromTensor):
    yield loader.tensor
  yield from getattr(loader, "source_tensors", ())
  for part in getattr(loader, "parts", ()):
    yield from source_tensors(part[0] if isinstance(part, tuple) else part)
  inner = getattr(loader, "inner", None)
  if inner is not None:
    yield from source_tensors(inner)


@dataclasses.dataclass(frozen=True)
class Leaf:
  path: tuple[str, ...]
  shape: Shape
  dtype: np.dtype
  sources: tuple[str, ...]
  loader: Any

  @property
  def name(self) -> str:
    return "/".join(self.path)

  @property
  def nbytes(self) -> int:
    return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

  @property
  def formats(self) -> tuple[str, ...]:
    """How its sources are stored ("BF16", "F8_E4M3 x F32 scales, 128x128 blocks", ...), each once."""
    return tuple(dict.fromkeys(t.format for t in source_tensors(self.loader)))


@dataclasses.dataclass(frozen=True)
class Plan:
  model: ResolvedModel
  source: TensorSource
  target_vocab_size: int
  scan_layers: bool
  save_dtype: np.dtype
  leaves: tuple[Leaf, ...]
  unused_tensors: tuple[str, ...]
  warnings: tuple[str, ...]
  fp8: Fp8Output | None = None  # Set by --keep_fp8: FP8 kernels and their scales, as MaxText's fp8 models hold them.

  @property
  def family(self) -> Family:
    return self.model.family

  @property
  def config(self) -> ModelConfig:
    return self.model.config

  @property
  def target_model(self) -> str:
    return self.model.target

  @property
  def runtime(self) -> Runtime:
    """What MaxText computes with this checkpoint: the recorded overrides and the decoder's fixed rules."""
    fp8 = self.fp8.overrides() if self.fp8 else {}
    return self.model.runtime.replace_config(vocab_size=self.target_vocab_size, scan_layers=self.scan_layers, **fp8)

  @property
  def total_bytes(self) -> int:
    return sum(leaf.nbytes for leaf in self.leaves)

  def tree(self, leaf_value=lambda leaf: leaf) -> dict[str, Any]:
    """The TrainState-shaped dict MaxText restores: {"step", "params": {"params": ...}, "opt_state"}."""
    params: dict[str, Any] = {}
    for leaf in self.leaves:
      node = params
      for key in leaf.path[:-1]:
        node = node.setdefault(key, {})
      node[leaf.path[-1]] = leaf_value(leaf)
    return {"step": 0, "params": {"params": params}, "opt_state": {}}


class _Sources:
  """Source tensors by name, with the checks every lookup needs."""

  def __init__(self, source: TensorSource, config: ModelConfig, save_dtype: np.dtype):
    self._source = source
    self._config = config
    self._dtype = save_dtype
    self.used: set[str] = set()

  def has(self, name: str) -> bool:
    return name in self._source.tensors

  def load(self, name: str, expected_shape: Shape, ops: tuple[Op, ...],
           lead: tuple[int, ...] = ()) -> tuple[FromTensor, Shape]:
    tensor = self._source.tensors.get(name)
    if tensor is None:
      raise ConversionError(
          f"{self._source.location}: tensor {name!r} is missing from the checkpoint"
          f" ({len(self._source.tensors)} tensors in {len(self._source.files)} file(s));"
          f" {self._config.architecture} with this config.json needs it"
      )
    files = ", ".join(tensor.files)
    if tensor.dtype not in FLOATING:
      raise ConversionError(
          f"{files}: tensor {name!r} has dtype {tensor.format}; only floating-point weights (F32, F16, BF16, F64)"
          " can be converted, or quantized ones whose config.json names a supported"
          " quantization_config.quant_method (quantized checkpoints must otherwise be dequantized first)"
      )
    if tuple(tensor.shape) != tuple(expected_shape):
      raise ConversionError(
          f"{files}: tensor {name!r} has shape {tuple(tensor.shape)}, but {self._config.path} implies"
          f" {tuple(expected_shape)}"
      )
    self.used.add(name)
    part = tuple(tensor.shape[len(lead):])
    try:
      shape = output_shape(ops, part)
    except ValueError as e:
      raise ConversionError(f"{files}: tensor {name!r}: {e}") from e
    return FromTensor(tensor, lead, ops, self._dtype, shape), shape


def _stack(parts: list[tuple[Any, Shape]], axis: int, dtype: np.dtype) -> tuple[Any, Shape]:
  part_shape = parts[0][1]
  shape = part_shape[:axis] + (len(parts),) + part_shape[axis:]
  return Stack(tuple(p for p, _ in parts), axis, shape, dtype), shape


def _param_loader(sources: _Sources, param: Param, layer: int | None, dtype: np.dtype) -> tuple[Any, Shape, list[str]]:
  """One MaxText layer's (or the top level's) value of `param`: its loader, shape and HF source names."""
  if layer is not None:
    layer = param.hf_layer(layer)
  if not param.experts:
    name = param.hf.format(layer=layer)
    loader, shape = sources.load(name, param.hf_shape, param.ops)
    return loader, shape, [name]
  if param.experts_in_tensor:
    name = param.hf.format(layer=layer)
    parts = [sources.load(name, param.hf_shape, param.ops, lead=(e,)) for e in range(param.experts)]
    loader, shape = _stack(parts, 0, dtype)
    return loader, shape, [name]
  names = [param.hf.format(layer=layer, expert=e) for e in range(param.experts)]
  parts = [sources.load(n, param.hf_shape, param.ops) for n in names]
  loader, shape = _stack(parts, 0, dtype)
  return loader, shape, names


def _leaf_loader(sources: _Sources, params: list[Param], layer: int | None,
                 dtype: np.dtype) -> tuple[Any, Shape, list[str]]:
  """One layer's value of a leaf: of its one param, or of several params joined into their slots."""
  if len(params) == 1 and params[0].leaf_slot is None:
    return _param_loader(sources, params[0], layer, dtype)
  parts, names, shape = [], [], None
  for param in params:
    if param.leaf_slot is None or param.experts:
      raise ConversionError(f"{param.maxtext}: several params write this leaf, so each needs a leaf_slot (and no"
                            " experts)")
    loader, part_shape, part_names = _param_loader(sources, param, layer, dtype)
    slot = param.leaf_slot
    axis = slot.axis % len(part_shape)
    shape = part_shape[:axis] + (slot.groups * sum(slot.sizes),) + part_shape[axis + 1:]
    parts.append((loader, slot))
    names += part_names
  return JoinSlots(tuple(parts), shape, dtype), shape, names


def _by_leaf(params: tuple[Param, ...]) -> dict[str, list[Param]]:
  """Params by the leaf they write, in order of first appearance."""
  leaves: dict[str, list[Param]] = {}
  for param in params:
    leaves.setdefault(param.maxtext, []).append(param)
  return leaves


def _layer_leaves(sources: _Sources, layout: Layout, dtype: np.dtype) -> Iterator[Leaf]:
  for group in layout.groups:
    group = group.resolved(sources.has)
    for maxtext, params in _by_leaf(group.params).items():
      per_layer = {layer: _leaf_loader(sources, params, layer, dtype) for _, layer in group.positions()}
      names = tuple(dict.fromkeys(n for _, _, ns in per_layer.values() for n in ns))
      path = (*group.path, *maxtext.split("/"))
      axis = params[0].scan_axis
      if not group.stacked:
        (loader, shape, _), = per_layer.values()
      elif group.nested:  # Layers of a block on the scan axis, then the blocks in front of them.
        blocks = [_stack([per_layer[layer][:2] for layer in block], axis, dtype) for block in group.layers]
        loader, shape = _stack(blocks, axis, dtype)
      else:
        loader, shape = _stack([per_layer[layer][:2] for layer in group.layers], axis, dtype)
      yield Leaf(path, shape, dtype, names, loader)


LOGITS_KERNEL = "decoder/logits_dense/kernel"


def check_tied_embeddings(source: TensorSource, config: ModelConfig, layout: Layout) -> None:
  """A checkpoint whose `tie_word_embeddings` contradicts its tensors is refused, naming both."""
  heads = [p.hf for p in layout.top if p.maxtext == LOGITS_KERNEL]
  if config.tie_word_embeddings:
    stored = sorted(n for n in source.tensors if n == "lm_head.weight" or n.endswith(".lm_head.weight"))
    if stored:
      raise ConversionError(
          f"{config.path}: tie_word_embeddings is true, but the checkpoint has its own {stored[0]!r}"
          f" (in {', '.join(source.tensors[stored[0]].files)}); fix the flag or drop the tensor"
      )
  elif heads and heads[0] not in source.tensors:
    raise ConversionError(
        f"{config.path}: tie_word_embeddings is false (or unset), but the checkpoint has no {heads[0]!r};"
        " set tie_word_embeddings to true if the model shares its embedding"
    )


def build_plan(
    source: TensorSource,
    model: ResolvedModel,
    *,
    scan_layers: bool,
    save_dtype: Any,
    target_vocab_size: int | None = None,
    allow_unused_tensors: bool = False,
    keep_fp8: bool = False,
) -> Plan:
  config = model.config
  dtype = np.dtype(save_dtype)
  target_vocab = target_vocab_size or config.vocab_size
  if target_vocab < config.vocab_size:
    raise ConversionError(
        f"--target_vocab_size={target_vocab} is smaller than the checkpoint's vocab_size {config.vocab_size}"
    )
  warnings = model.warnings()
  layout = model.layout(target_vocab, scan_layers)
  check_tied_embeddings(source, config, layout)
  sources = _Sources(source, config, dtype)
  leaves = []
  for maxtext, params in _by_leaf(layout.top).items():
    loader, shape, names = _leaf_loader(sources, params, None, dtype)
    leaves.append(Leaf(tuple(maxtext.split("/")), shape, dtype, tuple(names), loader))
  leaves.extend(_layer_leaves(sources, layout, dtype))
  ignored = {re.compile(pattern): reason for pattern, reason in model.family.ignored_tensors(config).items()}
  skipped: dict[str, list[str]] = {}
  for name in sorted(n for n in source.tensors if n not in sources.used):
    reason = next((r for p, r in ignored.items() if p.match(name)), None)
    if reason is not None:
      skipped.setdefault(reason, []).append(name)
  for reason, names in skipped.items():
    if reason:
      warnings.append(f"skipped {len(names)} tensor(s) ({', '.join(names[:2])}{' ...' if len(names) > 2 else ''}):"
                      f" {reason}")
  skipped_names = {n for names in skipped.values() for n in names}
  unused = sorted(n for n in source.tensors if n not in sources.used and n not in skipped_names)
  if unused:
    warnings.append(f"{len(unused)} unused tensor(s): {', '.join(unused[:5])}{' ...' if len(unused) > 5 else ''}")
  if unused and not allow_unused_tensors:
    shown = ", ".join(f"{n!r} ({', '.join(source.tensors[n].files)})" for n in unused[:5])
    raise ConversionError(
        f"{source.location}: {len(unused)} tensor(s) that {model.family.name} does not use: {shown}"
        f"{' ...' if len(unused) > 5 else ''}; the checkpoint may not match config.json"
        " (pass --allow_unused_tensors to convert anyway)"
    )
  fp8 = None
  if keep_fp8:
    fp8, leaves = _native_fp8(source, model, leaves)
  return Plan(model, source, target_vocab, scan_layers, dtype, tuple(leaves), tuple(unused), tuple(warnings), fp8)


def _native_fp8(source: TensorSource, model: ResolvedModel, leaves: list[Leaf]) -> tuple[Fp8Output, list[Leaf]]:
  unquantized = model.family.fp8_unquantized_modules
  if unquantized is None:
    with_fp8 = sorted(f.name for f in families.FAMILIES if f.fp8_unquantized_modules is not None)
    raise ConversionError(f"--keep_fp8: MaxText has no fp8 model for {model.family.name} ({model.target}); families"
                          f" with one: {', '.join(with_fp8)}. Convert without it (dequantized)")
  fp8 = native_fp8.fp8_output(list(source.tensors.values()), unquantized, source.location)
  return fp8, native_fp8.native_fp8_leaves(leaves, fp8, Leaf)
