"""MaxText -> HF planning: which slice of which stored leaf becomes (part of) which HF tensor, checked up front.

Derived from the same family descriptions as the forward direction, with no second table: every `Param` of the
family's layout names its MaxText leaf, its HF tensor and the ops between them, and `ops.inverse_ops` undoes
those ops. The layout's layer groups say which leaf holds which layer; layer stacking (at the param's scan axis)
and expert stacking (axis 0) are undone by indexing. Params that split one fused HF tensor (gate/up) are joined
back into it, a tensor holding every expert is written expert by expert, and a large 2-D tensor (an embedding, a
logits kernel, a 405B model's projection) a run of rows at a time, each read from the slab of the leaf the
forward direction wrote those rows into (loaders.row_slabs), so that none is ever held whole.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from converter.arrays import Shape
from converter import families, storage
from converter.checkpoint_format.layout import items_path_of
from converter.checkpoint_format.original import Original
from converter.checkpoint_format.record import ConversionRecord, original_config, original_model, recorded_field
from converter.errors import ConversionError
from converter.families import TOWER_SUBTREES, Family, LayerGroup, Param, leaf_index, leaf_shape
from converter.model_config import ModelConfig, check_claimed_counts, parse_model_config
from converter.ops import IntegerIds, Op, Slot, inverse_ops, is_exact, output_shape
from converter.planning.loaders import ROW_BLOCK_BYTES, row_slabs, slab_ops
from converter.reverse.safetensors_output import TensorSpec
from converter.sources import SAFETENSORS_DTYPES
from converter.sources.maxtext import check_recorded_dtype, model_tree

if TYPE_CHECKING:  # Imported where used: planning needs only the reader's metadata.
  from converter.sources.checkpoint_reader import CheckpointReader, StoredArray

_SAFETENSORS_CODES = {dtype: code for code, dtype in SAFETENSORS_DTYPES.items()}


@dataclasses.dataclass(frozen=True)
class HfPart:
  """`ops` applied to `leaf[index]`, written where `split` took it from in the HF tensor (None: all of it)."""

  leaf: tuple[str, ...]  # Tree keys of the stored array.
  index: tuple[Any, ...]  # ints (layer, expert) and full slices.
  ops: tuple[Op, ...]
  split: Slot | None


@dataclasses.dataclass(frozen=True)
class HfTensor:
  """One HF tensor, made of `pieces`: consecutive runs along its first axis when `in_pieces` (a tensor holding
  every expert: one expert each; a large 2-D tensor: rows), else a single piece; each piece is one or more parts
  (the halves of a fused projection)."""

  name: str
  shape: Shape
  dtype: np.dtype
  pieces: tuple[tuple[HfPart, ...], ...]
  in_pieces: bool
  exact: bool  # Whether the ops undo the forward ops bit for bit.

  @property
  def spec(self) -> TensorSpec:
    return TensorSpec(self.name, self.shape, self.dtype)

  @property
  def nbytes(self) -> int:
    return self.spec.nbytes

  @property
  def piece_shape(self) -> Shape:
    return self.shape[1:] if self.in_pieces else self.shape


@dataclasses.dataclass(frozen=True)
class ReversePlan:
  items_path: str
  family: Family
  config: ModelConfig
  hf_config: dict[str, Any]
  # The original model, whose tokenizer and serving files the way back copies: --hf_config_path's directory, else
  # where the conversion to MaxText read it (None: neither is known).
  original: Original | None
  target_model: str
  scan_layers: bool
  dtype: np.dtype
  tensors: tuple[HfTensor, ...]
  warnings: tuple[str, ...]
  # Leaves no HF tensor is made from, and the value every element must hold (Param.constant): a MaxText run that
  # trained them away from it made a model HF cannot express (convert_to_huggingface refuses it).
  constants: tuple[tuple[tuple[str, ...], float], ...] = ()

  @property
  def total_bytes(self) -> int:
    return sum(t.nbytes for t in self.tensors)

  @property
  def inexact_tensors(self) -> tuple[str, ...]:
    return tuple(t.name for t in self.tensors if not t.exact)


def _row_slab_parts(param: Param, leaf: tuple[str, ...], index: tuple[Any, ...], per_tensor: Shape, stacked: int,
                    itemsize: int) -> list[HfPart] | None:
  """A large 2-D HF tensor (one part, no slot) as runs of its rows: each run is read from the slab of the leaf
  that the forward direction converted those rows into, and undone with that slab's ops; None when the tensor
  is small or its ops do not map rows to slabs."""
  part_shape = tuple(param.part_shape)
  if (param.experts or param.leaf_slot is not None or len(part_shape) != 2 or
      math.prod(per_tensor) * itemsize <= ROW_BLOCK_BYTES):
    return None
  slabs = row_slabs(param.ops, part_shape)
  if slabs is None:
    return None
  size = per_tensor[slabs.axis]
  step = max(1, ROW_BLOCK_BYTES // (math.prod(per_tensor) // size * itemsize))
  leaf_axis = slabs.axis + (stacked if slabs.axis >= param.scan_axis else 0)
  full = list(index) + [slice(None)] * (len(per_tensor) + stacked - len(index))
  parts = []
  for start in range(0, size, step):
    stop = min(start + step, size)
    rows = min(stop * slabs.unit, part_shape[0]) - start * slabs.unit
    if rows <= 0:
      break  # Only rows MaxText pads (a vocabulary padded to a multiple) are left.
    full[leaf_axis] = slice(start, stop)
    parts.append(HfPart(leaf, tuple(full), inverse_ops(slab_ops(param.ops, slabs, stop - start),
                                                        (rows, part_shape[1])), None))
  return parts


def _show(keys: Sequence[str]) -> str:
  return "/".join(keys)


class _Builder:
  """Collects HF tensors part by part, in storage order, and checks that fused tensors are complete."""

  def __init__(self):
    self.entries: dict[str, dict[str, Any]] = {}

  def add(self, name: str, param: Param, piece: int, part: HfPart, dtype: np.dtype, in_pieces: bool = False) -> None:
    entry = self.entries.setdefault(name, {"shape": tuple(param.hf_shape), "dtype": dtype, "pieces": {},
                                           "in_pieces": param.experts_in_tensor or in_pieces, "exact": True})
    entry["pieces"].setdefault(piece, []).append(part)
    entry["exact"] &= is_exact(param.ops)

  def tensors(self, family: str) -> list[HfTensor]:
    result = []
    for name, entry in self.entries.items():
      pieces = tuple(tuple(entry["pieces"][k]) for k in sorted(entry["pieces"]))
      for parts in pieces:
        splits = [p.split for p in parts]
        if (len(parts) > 1 or splits[0] is not None) and (
            None in splits or sorted(s.index for s in splits) != list(range(len(splits[0].sizes)))):
          raise ConversionError(f"{family}: the layout maps several leaves to HF tensor {name!r} without splitting it"
                                " into complementary parts")
      result.append(HfTensor(name, entry["shape"], entry["dtype"], pieces, entry["in_pieces"], entry["exact"]))
    return result


def plan_to_huggingface(
    checkpoint_path: str,
    *,
    family: str | None = None,
    hf_config_path: str | None = None,
    target_model: str | None = None,
    reader: CheckpointReader | None = None,
) -> ReversePlan:
  """Everything checkable without reading weights: family, config, every leaf present with the right shape."""
  items_path = items_path_of(checkpoint_path)
  record = ConversionRecord.read(items_path)
  hf_config, source = original_config(items_path, record, hf_config_path)
  config = parse_model_config(hf_config, source)
  warnings: list[str] = []
  if family and record.family and record.family != family:
    warnings.append(f"--family={family} overrides the checkpoint's recorded family {record.family!r}")
  if reader is None:
    from converter.sources.checkpoint_reader import CheckpointReader  # pylint: disable=g-import-not-at-top

    reader = CheckpointReader(items_path, dequantize_fp8=True)
  tree = model_tree(reader.arrays, items_path)
  params = tree.params
  for array in params.values():
    check_recorded_dtype(items_path, array, record)
  check_claimed_counts(config, (a.shape for a in params.values()), items_path)
  # The tree says whether the towers were converted (a checkpoint MaxText's trainer wrote records nothing).
  towers = any(k[0] in TOWER_SUBTREES for k in params)
  model = families.resolve(config, family=family or record.family, target_model=target_model or record.target_model,
                           family_named_by="--family" if family else recorded_field(items_path, "family"),
                           text_only=not towers)
  fam, target = model.family, model.target
  if towers and not model.multimodal:
    raise ConversionError(f"{items_path}: the checkpoint holds {'/'.join(sorted({k[0] for k in params} & set(TOWER_SUBTREES)))}"
                          f" leaves, but {fam.name} ({target}) with {source} has no towers to write them to")
  if record.scan_layers is not None:
    scan_layers = record.scan_layers
  else:
    scan_layers = model.stored_scanned(params)
    warnings.append(f"no scan_layers in the checkpoint metadata; {'scanned' if scan_layers else 'unscanned'}"
                    " layers found in the tree")
  embedding = params.get(("token_embedder", "embedding"))
  if embedding is None:
    raise ConversionError(f"{items_path}: leaf {tree.show(('token_embedder', 'embedding'))} is missing")
  target_vocab = embedding.shape[0]
  if target_vocab < config.vocab_size:
    raise ConversionError(
        f"{items_path}: token_embedder/embedding has {target_vocab} rows, fewer than {source}'s vocab_size"
        f" {config.vocab_size}"
    )
  layout = model.layout(target_vocab, scan_layers)
  used: set[tuple[str, ...]] = set()
  constants: list[tuple[tuple[str, ...], float]] = []
  builder = _Builder()
  scanned = "scanned" if scan_layers else "unscanned"

  def leaf(keys: tuple[str, ...], expected: Shape) -> StoredArray:
    array = params.get(keys)
    if array is None:
      raise ConversionError(
          f"{items_path}: leaf {tree.show(keys)} is missing; {fam.name} ({target}, {scanned}) with"
          f" {source} needs it"
      )
    if array.shape != expected:
      raise ConversionError(
          f"{items_path}: leaf {tree.show(keys)} has shape {array.shape}, but {source} implies"
          f" {expected} ({scanned})"
      )
    if array.dtype not in _SAFETENSORS_CODES or array.dtype.kind not in "fV":
      raise ConversionError(f"{items_path}: leaf {tree.show(keys)} has dtype {array.dtype}, not a float")
    used.add(keys)
    return array

  def add(param: Param, keys: tuple[str, ...], group: LayerGroup | None) -> None:
    if param.constant is not None:
      stacking = group.stacking if group and group.stacked else ()
      array = leaf(keys, leaf_shape(tuple(param.hf_shape), param, stacking))
      constants.append((array.path, param.constant))
      return
    try:
      per_tensor = output_shape(param.ops, param.part_shape)
      ops = inverse_ops(param.ops, param.part_shape)
    except ValueError as e:
      raise ConversionError(f"{source}: {param.hf}: {e}") from e
    split = param.ops[0] if param.ops and isinstance(param.ops[0], Slot) else None
    if param.leaf_slot is not None:
      ops = (param.leaf_slot,) + ops  # First its slot of the shared leaf, then the inverse of its ops.
    stacking = group.stacking if group is not None and group.stacked else ()
    array = leaf(keys, leaf_shape(per_tensor, param, stacking))
    ids = param.ops[0] if param.ops and isinstance(param.ops[0], IntegerIds) else None
    dtype = np.dtype(ids.hf_dtype) if ids is not None else array.dtype

    def add_tensor(name: str, index: tuple[Any, ...], piece: int) -> None:
      slab_parts = _row_slab_parts(param, array.path, index, per_tensor, len(stacking), array.dtype.itemsize)
      if slab_parts is None:
        builder.add(name, param, piece, HfPart(array.path, index, ops, split), dtype)
      for k, part in enumerate(slab_parts or ()):
        builder.add(name, param, k, part, dtype, in_pieces=True)

    if group is None:
      if param.experts:
        raise ConversionError(f"{fam.name}: top-level parameter {param.maxtext} with experts is not supported")
      add_tensor(param.hf, (), 0)
      return
    # Experts outermost, layers next: consecutive reads stay inside the same chunks.
    for expert in range(param.experts) if param.experts else [None]:
      for position, layer in group.positions():
        name = param.hf.format(layer=param.hf_layer(layer), expert=expert)
        add_tensor(name, leaf_index(param, expert, position if group.stacked else ()),
                   expert if param.experts_in_tensor else 0)

  for param in layout.top:
    add(param, tuple(param.maxtext.split("/")), None)
  for group in layout.groups:
    group = group.resolved()
    for param in group.params:
      add(param, tuple(group.path) + tuple(param.maxtext.split("/")), group)

  tensors = builder.tensors(fam.name)
  unused = sorted(_show(k) for k in params if k not in used)
  if unused:
    shown = ", ".join(unused[:5]) + (" ..." if len(unused) > 5 else "")
    raise ConversionError(
        f"{items_path}: {len(unused)} leaf/leaves {tree.where} that {fam.name} ({target}, {scanned}) with"
        f" {source} does not use: {shown}"
    )
  dtypes = sorted({t.dtype for t in tensors if t.dtype.kind in "fV"}, key=lambda d: d.itemsize)
  if len(dtypes) > 1:
    warnings.append(f"leaves have mixed dtypes ({', '.join(d.name for d in dtypes)}); each tensor keeps its own")
  if target_vocab > config.vocab_size:
    warnings.append(f"vocabulary padded to {target_vocab} in MaxText: rows {config.vocab_size}.. are dropped")
  inexact = sum(not t.exact for t in tensors)
  if inexact:
    warnings.append(f"{inexact} tensor(s) were transformed in float arithmetic (query scale, norm offset): undone"
                    " to within one unit in the last place, not bit for bit")
  if model.skipped_towers is not None:
    warnings.append(f"the checkpoint holds {config.architecture}'s text decoder only (converted with --text_only):"
                    " its towers are not written, so transformers will report them missing; pass --hf_config_path"
                    " with a text-only config.json to write a text model")
  if record.quant_method:
    warnings.append(f"the original checkpoint was {record.quant_method}-quantized; its weights come back"
                    f" dequantized ({dtypes[-1].name}) and config.json without quantization_config")
  return ReversePlan(items_path, fam, config, hf_config, original_model(record, hf_config_path), target, scan_layers,
                     dtypes[-1], tuple(tensors), tuple(warnings), tuple(constants))
