"""Turns a family's layout and a checkpoint's tensor source into the full list of output leaves.

Everything that can be checked without reading weights is checked here (every tensor present, every shape as
`config.json` implies, nothing left over, dtypes convertible), so a bad input fails before the first byte is
written. The plan's leaves carry picklable loaders (converter/planning/loader.py, loaders.py); nothing is read until
a loader is called, and then only through the source, which dequantizes whatever the checkpoint stores quantized.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Iterator

import numpy as np

from converter import families
from converter.planning import loaders
from converter.layout import logical_axes
from converter.planning import native_fp8
from converter.arrays import Shape
from converter.layout.chunking import ChunkRule
from converter.errors import ConversionError
from converter.families import Family, LayerGroup, Layout, Param, ResolvedModel
from converter.families.runtime import Runtime
from converter.planning.loader import Loader
from converter.planning.loaders import Fill, FromTensor, JoinSlots, Stack
from converter.model_config import ModelConfig
from converter.planning.native_fp8 import Fp8Output
from converter.ops import IntegerIds, Op, output_shape
from converter.options import PlanOptions
from converter.sources import FLOATING, TensorSource


@dataclasses.dataclass(frozen=True)
class Leaf:
  path: tuple[str, ...]
  shape: Shape
  dtype: np.dtype
  sources: tuple[str, ...]
  loader: Loader
  # MaxText's logical axis names (converter/layout/logical_axes.py): where a restoring mesh shards it, so where its
  # stored chunks are cut (`chunk_shape`, converter/layout/chunking.py). None: unannotated; whole write blocks.
  logical_axes: tuple[str | None, ...] | None = None
  chunk_shape: Shape | None = None
  chunk_order: tuple[int, ...] | None = None  # Stored outermost axis first (`ChunkRule.chunk_order`); None: C.
  # Each stored chunk's elements, outermost axis first: the loader's layout (`loaders.in_source_order`); None: C.
  element_order: tuple[int, ...] | None = None
  host_shape: Shape | None = None  # One restoring host's part, stored apart (`ChunkRule.host_shape`); None: none.

  @property
  def name(self) -> str:
    return "/".join(self.path)

  @property
  def nbytes(self) -> int:
    return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

  @property
  def formats(self) -> tuple[str, ...]:
    """How its sources are stored ("BF16", "F8_E4M3 x F32 scales, 128x128 blocks", ...), each once."""
    return tuple(dict.fromkeys(t.format for t in self.loader.source_tensors()))


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
  chunking: ChunkRule = ChunkRule()

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
  def zstd_level(self) -> int:
    """zstd's level for this plan's stored chunks unless one is asked for (`default_zstd_level`)."""
    return default_zstd_level(dequantizing=self.source.quant_method is not None and self.fp8 is None)

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


def alias_renamer(aliases: tuple[tuple[str, str], ...]) -> Callable[[str], str]:
  """A stored name as the family's layout reads it: renamed by the first alias (regex, replacement) that matches."""
  patterns = [(re.compile(pattern), replacement) for pattern, replacement in aliases]
  return lambda name: next((p.sub(r, name, count=1) for p, r in patterns if p.match(name)), name)


def layout_names(source: TensorSource, aliases: tuple[tuple[str, str], ...]) -> dict[str, Any]:
  """The source's tensors under the names the family's layout uses (`alias_renamer`). Two stored tensors landing
  on one name are refused, naming both."""
  rename = alias_renamer(aliases)
  named: dict[str, Any] = {}
  for name, tensor in source.tensors.items():
    layout_name = rename(name)
    if layout_name in named:
      raise ConversionError(f"{source.location}: tensors {named[layout_name].name!r} and {name!r} are two names of"
                            f" one weight ({layout_name!r}); the checkpoint mixes two naming schemes")
    named[layout_name] = tensor
  return named


class _Sources:
  """Source tensors by the layout's names, with the checks every lookup needs."""

  def __init__(self, source: TensorSource, tensors: dict[str, Any], config: ModelConfig):
    self._source = source
    self.tensors = tensors
    self._config = config
    self.used: set[str] = set()

  def shape(self, name: str) -> Shape | None:
    """The stored shape of `name`, None when the checkpoint lacks it."""
    tensor = self.tensors.get(name)
    return None if tensor is None else tuple(tensor.shape)

  def stored(self, names: list[str]) -> list[str]:
    """The names the checkpoint stores these layout names' tensors under (what messages show)."""
    return [self.tensors[n].name if n in self.tensors else n for n in names]

  def load(self, name: str, expected_shape: Shape, ops: tuple[Op, ...], dtype: np.dtype,
           lead: tuple[int, ...] = ()) -> tuple[FromTensor, Shape]:
    tensor = self.tensors.get(name)
    if tensor is None:
      raise ConversionError(
          f"{self._source.location}: tensor {name!r} is missing from the checkpoint"
          f" ({len(self.tensors)} tensors in {len(self._source.files)} file(s));"
          f" {self._config.architecture} with this config.json needs it"
      )
    self.used.add(name)
    files = ", ".join(tensor.files)
    if tensor.name != name:
      name = f"{tensor.name}' (read as '{name}"
    ids = ops[0] if ops and isinstance(ops[0], IntegerIds) else None
    if ids is not None and tensor.dtype.kind in "iu":
      if not ids.exact_in(dtype):
        raise ConversionError(
            f"{files}: tensor {name!r} holds ids up to {ids.bound - 1}, which --save_dtype={dtype.name} cannot"
            " all represent exactly; convert with --save_dtype=float32")
    elif tensor.dtype not in FLOATING:
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
    part = tuple(tensor.shape[len(lead):])
    try:
      shape = output_shape(ops, part)
    except ValueError as e:
      raise ConversionError(f"{files}: tensor {name!r}: {e}") from e
    return FromTensor(tensor, lead, ops, dtype, shape), shape


def stack(parts: list[tuple[Loader, Shape]], axis: int, dtype: np.dtype) -> tuple[Loader, Shape]:
  part_shape = parts[0][1]
  shape = part_shape[:axis] + (len(parts),) + part_shape[axis:]
  return Stack(tuple(p for p, _ in parts), axis, shape, dtype), shape


def _param_loader(sources: _Sources, param: Param, layer: int | None, dtype: np.dtype) -> tuple[Loader, Shape, list[str]]:
  """One MaxText layer's (or the top level's) value of `param`: its loader, shape and HF source names."""
  if layer is not None:
    layer = param.hf_layer(layer)
  if param.constant is not None:
    shape = tuple(param.hf_shape)
    return Fill(param.constant, shape, dtype), shape, []
  if not param.experts:
    name = param.hf.format(layer=layer)
    loader, shape = sources.load(name, param.hf_shape, param.ops, dtype)
    return loader, shape, sources.stored([name])
  if param.experts_in_tensor:
    name = param.hf.format(layer=layer)
    parts = [sources.load(name, param.hf_shape, param.ops, dtype, lead=(e,)) for e in range(param.experts)]
    loader, shape = stack(parts, 0, dtype)
    return loader, shape, sources.stored([name])
  names = [param.hf.format(layer=layer, expert=e) for e in range(param.experts)]
  parts = [sources.load(n, param.hf_shape, param.ops, dtype) for n in names]
  loader, shape = stack(parts, 0, dtype)
  return loader, shape, sources.stored(names)


def _leaf_loader(sources: _Sources, params: list[Param], layer: int | None,
                 dtype: np.dtype) -> tuple[Loader, Shape, list[str]]:
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


def by_leaf(params: tuple[Param, ...]) -> dict[str, list[Param]]:
  """Params by the leaf they write, in order of first appearance."""
  leaves: dict[str, list[Param]] = {}
  for param in params:
    leaves.setdefault(param.maxtext, []).append(param)
  return leaves


def leaf_axes(param: Param, rank: int) -> tuple[str | None, ...] | None:
  """MaxText's logical axes of one layer's value of `param`'s leaf: the family's where it names them."""
  return param.logical_axes if param.logical_axes is not None else logical_axes.per_layer(param.maxtext, rank)


def _leaf_dtype(sources: _Sources, params: list[Param], layer: int | None, save_dtype: np.dtype) -> np.dtype:
  """--save_dtype, or float32 for a leaf whose params all keep the float32 their checkpoint stores."""
  if save_dtype.itemsize >= 4 or not all(p.keep_float32 for p in params):
    return save_dtype
  names = [p.hf.format(layer=None if layer is None else p.hf_layer(layer)) for p in params]
  stored = [sources.tensors.get(n) for n in names]
  return np.dtype(np.float32) if all(t is not None and t.dtype == np.float32 for t in stored) else save_dtype


def _layer_leaves(sources: _Sources, layout: Layout, save_dtype: np.dtype) -> Iterator[Leaf]:
  for group in layout.groups:
    group = group.resolved(sources.shape)
    for maxtext, params in by_leaf(group.params).items():
      dtype = _leaf_dtype(sources, params, next(iter(group.positions()))[1], save_dtype)
      per_layer = {layer: _leaf_loader(sources, params, layer, dtype) for _, layer in group.positions()}
      names = tuple(dict.fromkeys(n for _, _, ns in per_layer.values() for n in ns))
      loader, shape = stack_layers(group, {layer: part[:2] for layer, part in per_layer.items()},
                                   params[0].scan_axis, dtype)
      yield Leaf((*group.path, *maxtext.split("/")), shape, dtype, names, loader, group_leaf_axes(group, params[0],
                                                                                                  len(shape)))


def stack_layers(group: LayerGroup, per_layer: dict[int, tuple[Loader, Shape]], axis: int,
                 dtype: np.dtype) -> tuple[Loader, Shape]:
  """One leaf of `group` from each of its layers' values (by MaxText layer): the one layer's own, or stacked at
  `axis` (a nested group: each block's layers on the scan axis, then the blocks in front of them)."""
  if not group.stacked:
    (part,) = per_layer.values()
    return part
  if group.nested:
    blocks = [stack([per_layer[layer] for layer in block], axis, dtype) for block in group.layers]
    return stack(blocks, axis, dtype)
  return stack([per_layer[layer] for layer in group.layers], axis, dtype)


def group_leaf_axes(group: LayerGroup, param: Param, rank: int) -> tuple[str | None, ...] | None:
  """MaxText's logical axes of a `rank`-axis leaf of `group` whose first param is `param`: its per-layer axes, with
  the group's stacking axes at the param's scan axis."""
  if not group.stacked:
    return leaf_axes(param, rank)
  stacking = group.stacking_names
  return logical_axes.stacked(leaf_axes(param, rank - len(stacking)), param.scan_axis, stacking)


LOGITS_KERNEL = "decoder/logits_dense/kernel"


def check_tied_embeddings(tensors: dict[str, Any], config: ModelConfig, layout: Layout) -> None:
  """A checkpoint whose `tie_word_embeddings` contradicts its tensors is refused, naming both."""
  heads = [p.hf for p in layout.top if p.maxtext == LOGITS_KERNEL]
  if config.tie_word_embeddings:
    stored = sorted(n for n in tensors if n == "lm_head.weight" or n.endswith(".lm_head.weight"))
    if stored:
      raise ConversionError(
          f"{config.path}: tie_word_embeddings is true, but the checkpoint has its own {stored[0]!r}"
          f" (in {', '.join(tensors[stored[0]].files)}); fix the flag or drop the tensor"
      )
  elif heads and heads[0] not in tensors:
    raise ConversionError(
        f"{config.path}: tie_word_embeddings is false (or unset), but the checkpoint has no {heads[0]!r};"
        " set tie_word_embeddings to true if the model shares its embedding"
    )


def build_plan(source: TensorSource, model: ResolvedModel, options: PlanOptions) -> Plan:
  """Every output leaf of `model` read from `source`, checked against each other; `options.target_model` is
  `model`'s already (families.resolve)."""
  config = model.config
  dtype = np.dtype(options.save_dtype)
  scan_layers = options.scan_layers
  target_vocab = options.target_vocab_size or config.vocab_size
  if target_vocab < config.vocab_size:
    raise ConversionError(
        f"--target_vocab_size={target_vocab} is smaller than the checkpoint's vocab_size {config.vocab_size}"
    )
  warnings = model.warnings()
  deepstack = dict(model.runtime.config.towers or ()).get("deepstack_visual_indexes_for_vit")
  if scan_layers and deepstack:
    raise ConversionError(
        f"--scan_layers=true: {config.path}'s vision tower feeds deepstack features (vision_config."
        f"deepstack_visual_indexes={list(deepstack)}) into the decoder, which MaxText 0.2.5 does only unscanned"
        f" (configs/types.py refuses deepstack_visual_indexes_for_vit with scan_layers=true for {model.target});"
        " convert with --scan_layers=false, or with --text_only for a text decoder that scans")
  layout = model.layout(target_vocab, scan_layers)
  tensors = layout_names(source, model.tensor_aliases())
  check_tied_embeddings(tensors, config, layout)
  sources = _Sources(source, tensors, config)
  leaves = []
  for maxtext, params in by_leaf(layout.top).items():
    leaf_dtype = _leaf_dtype(sources, params, None, dtype)
    loader, shape, names = _leaf_loader(sources, params, None, leaf_dtype)
    leaves.append(Leaf(tuple(maxtext.split("/")), shape, leaf_dtype, tuple(names), loader,
                       leaf_axes(params[0], len(shape))))
  leaves.extend(_layer_leaves(sources, layout, dtype))
  ignored = {re.compile(pattern): reason for pattern, reason in model.ignored_tensors().items()}
  skipped: dict[str, list[str]] = {}
  for name in sorted(n for n in tensors if n not in sources.used):
    reason = next((r for p, r in ignored.items() if p.match(name)), None)
    if reason is not None:
      skipped.setdefault(reason, []).append(name)
  for reason, names in skipped.items():
    if reason:
      warnings.append(f"skipped {len(names)} tensor(s) ({', '.join(names[:2])}{' ...' if len(names) > 2 else ''}):"
                      f" {reason}")
  skipped_names = {n for names in skipped.values() for n in names}
  unused = sorted(n for n in tensors if n not in sources.used and n not in skipped_names)
  if unused:
    warnings.append(f"{len(unused)} unused tensor(s): {', '.join(unused[:5])}{' ...' if len(unused) > 5 else ''}")
  if unused and not options.allow_unused_tensors:
    shown = ", ".join(f"{n!r} ({', '.join(tensors[n].files)})" for n in unused[:5])
    raise ConversionError(
        f"{source.location}: {len(unused)} tensor(s) that {model.family.name} does not use: {shown}"
        f"{' ...' if len(unused) > 5 else ''}; the checkpoint may not match config.json"
        " (pass --allow_unused_tensors to convert anyway)"
    )
  fp8 = None
  if options.keep_fp8:
    fp8, leaves = _native_fp8(source, model, leaves)
  leaves = [chunked(leaf, options.chunking) for leaf in leaves]
  return Plan(model, source, target_vocab, scan_layers, dtype, tuple(leaves), tuple(unused), tuple(warnings), fp8,
              options.chunking)


def default_zstd_level(dequantizing: bool) -> int:
  """zstd's level by default: 1 for weights read as they were trained, whose bytes have few repeats for level 3's
  match finder (as few bytes stored, a quarter less CPU); Orbax's own 3 where they are dequantized, as they then
  take few distinct values that repeat (DeepSeek-V3 FP8 dequantized: 9% more bytes at level 1). Measured:
  docs/memory-and-streaming.md, "Compression"."""
  return 3 if dequantizing else 1


def chunked(leaf: Leaf, rule: ChunkRule) -> Leaf:
  """`leaf` with its stored chunks cut by `rule`. With `rule.huggingface_element_order`, where chunks are cut and
  the loader can read in its sources' layout, it does, and the chunks keep that layout: the kernels' transposes
  are then done by the store's own copy into its chunks instead of by the converter's transposing copy before it,
  and undone by every restore (docs/loading-on-a-pod.md)."""
  axes = leaf.logical_axes or (None,) * len(leaf.shape)
  chunk_shape = rule.chunk_shape(leaf.shape, axes, leaf.dtype.itemsize)
  leaf = dataclasses.replace(leaf, chunk_shape=chunk_shape, chunk_order=rule.chunk_order(axes),
                             host_shape=rule.host_shape(leaf.shape, axes))
  in_source_order = (loaders.in_source_order(leaf.loader)
                     if chunk_shape is not None and rule.huggingface_element_order else None)
  if in_source_order is None:
    return leaf
  loader, order = in_source_order
  return dataclasses.replace(leaf, loader=loader, element_order=None if order == tuple(range(len(order))) else order)


def _native_fp8(source: TensorSource, model: ResolvedModel, leaves: list[Leaf]) -> tuple[Fp8Output, list[Leaf]]:
  unquantized = model.family.fp8_unquantized_modules
  if model.multimodal:
    raise ConversionError(f"--keep_fp8: MaxText's fp8 models take no use_multimodal, so {model.target} cannot run"
                          f" {model.config.path}'s towers in FP8; pass --target_model=<its -fp8 name> (or"
                          " --text_only) to keep the text decoder's FP8 kernels alone, or convert without --keep_fp8"
                          " (dequantized, towers included)")
  if unquantized is None:
    with_fp8 = sorted(f.name for f in families.FAMILIES if f.fp8_unquantized_modules is not None)
    raise ConversionError(f"--keep_fp8: MaxText has no fp8 model for {model.family.name} ({model.target}); families"
                          f" with one: {', '.join(with_fp8)}. Convert without it (dequantized)")
  fp8 = native_fp8.fp8_output(list(source.tensors.values()), unquantized, source.location)
  return fp8, native_fp8.native_fp8_leaves(leaves, fp8, Leaf)
