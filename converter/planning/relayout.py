"""MaxText -> MaxText planning: a MaxText checkpoint's parameters as the leaves of another, scanned or not, in
another dtype and chunk grid, checked up front.

The family's layout is read twice over the same model: once as the source checkpoint stacks its layers (where each
layer's value of each leaf lies: which leaf, at which positions of its stacking axes), once as the output stacks
them. An output leaf is then the source's leaf itself (same stacking: re-chunked, cast) or a stack of its layers'
slices (`loaders.Copy` of `MaxTextTensor.at`): values are copied, never transformed, so every float32 leaf comes
out bit for bit. The plan is the forward direction's `Plan`, so the output, `--verify`, `--dry_run`, resume and
several processes treat it as any other.

A native fp8 checkpoint (converted with --keep_fp8) keeps its FP8 kernels as stored and each one's `_scale` leaf in
float32: a scale leaf keeps its kernel's stacking axes whole at the same positions (converter/planning/native_fp8.py),
so it is laid out as its kernel is, its own chunk grid cut by the same rule.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from converter import families
from converter.lora import lora_export
from converter.planning import native_fp8
from converter.planning import plan as plan_lib
from converter.arrays import Shape
from converter.errors import ConversionError
from converter.families import LayerGroup, Layout, Param
from converter.planning.loaders import AddLowRank, Copy
from converter.model_config import check_claimed_counts, parse_model_config
from converter.ops import output_shape
from converter.options import PlanOptions, ReverseOptions
from converter.checkpoint_format.layout import items_path_of, metadata_path
from converter.checkpoint_format.record import ConversionRecord, original_config, recorded_field
from converter.families import TOWER_SUBTREES, leaf_shape
from converter.sources.maxtext import EMBEDDING, MaxTextSource, MaxTextTensor, open_maxtext

# Where one layer's value of one leaf lies in the source: its path below the parameters and the positions on its
# stacking axes ((axis, position), none for an unstacked group).
_Located = tuple[str, tuple[tuple[int, int], ...]]


def _per_layer_shape(param: Param) -> Shape:
  """One layer's value of `param`'s leaf (every param of a shared leaf gives the same)."""
  if param.constant is not None:
    return tuple(param.hf_shape)
  try:
    return leaf_shape(output_shape(param.ops, param.part_shape), param, ())
  except ValueError as e:
    raise ConversionError(f"{param.maxtext} ({param.hf}): {e}") from e


def _stacked_at(axis: int, position: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
  """(axis, position) of each stacking axis of a layer at `position`, the first at `axis` (the param's scan axis)."""
  return tuple((axis + i, p) for i, p in enumerate(position))


def _source_layers(layout: Layout) -> dict[tuple[str, int], _Located]:
  """Where the source keeps each layer's value of each layer leaf, by (its path within the group, MaxText
  layer)."""
  layers: dict[tuple[str, int], _Located] = {}
  for group in layout.groups:
    group = group.resolved()
    for maxtext, params in plan_lib.by_leaf(group.params).items():
      path = "/".join((*group.path, maxtext))
      for position, layer in group.positions():
        fixed = _stacked_at(params[0].scan_axis, position) if group.stacked else ()
        layers[(maxtext, layer)] = (path, fixed)
  return layers


def _recorded_fp8(items_path: str, record: ConversionRecord) -> native_fp8.Fp8Output | None:
  """What a native fp8 checkpoint's record says of its FP8 kernels (None: not one)."""
  if not record.fp8:
    return None
  try:
    fp8 = record.fp8
    block = fp8["block"]
    if not isinstance(block, int) or isinstance(block, bool) or block <= 0:
      raise ValueError(f"block {block!r} is not a positive integer")
    return native_fp8.Fp8Output(str(fp8["weight_dtype"]), block, tuple(str(m) for m in fp8["unquantized_modules"]))
  except (KeyError, TypeError, ValueError) as e:
    raise ConversionError(f"{metadata_path(items_path)}: custom_metadata.hf2maxtext.fp8 is not what a --keep_fp8"
                          f" conversion records ({type(e).__name__}: {e})") from e


def plan_relayout(checkpoint_path: str, options: PlanOptions, *, family: str | None = None,
                  hf_config_path: str | None = None, lora_checkpoint_path: str | None = None,
                  lora_alpha: float | None = None) -> plan_lib.Plan:
  """The MaxText checkpoint at `checkpoint_path` (OUT/N or OUT/N/items; ours, MaxText's converter's or trainer's)
  as a params-only checkpoint laid out by `options` (scan_layers, save_dtype, chunking), with a MaxText LoRA
  checkpoint's factors merged in (`lora_checkpoint_path`; `lora_alpha` where it records none): everything checked
  from the metadata before a byte is read."""
  if options.keep_fp8 or options.lora_adapter_path or options.text_only:
    raise ConversionError("--checkpoint_path (a MaxText checkpoint laid out again) takes no --keep_fp8,"
                          " --lora_adapter_path or --text_only: its leaves are copied as they are")
  items_path = items_path_of(checkpoint_path)
  record = ConversionRecord.read(items_path)  # Whether its kernels are native FP8 says how to open it: once.
  fp8 = _recorded_fp8(items_path, record)
  if fp8 is not None and lora_checkpoint_path:
    raise ConversionError(f"{items_path}: a native fp8 checkpoint (--keep_fp8) keeps its FP8 kernels as stored, so"
                          " a LoRA checkpoint cannot be merged into them; merge into a dequantized conversion")
  source = open_maxtext(items_path, raw_fp8=fp8 is not None)
  hf_config, config_source = original_config(items_path, record, hf_config_path)
  config = parse_model_config(hf_config, config_source)
  check_claimed_counts(config, (t.shape for t in source.tensors.values()), items_path)
  towers = any(name.split("/")[0] in TOWER_SUBTREES for name in source.tensors)
  model = families.resolve(config, family=family or record.family,
                           family_named_by="--family" if family else recorded_field(items_path, "family"),
                           target_model=options.target_model or record.target_model, text_only=not towers)
  embedding = source.tensors.get("/".join(EMBEDDING))
  if embedding is None:
    raise ConversionError(f"{items_path}: leaf {source.tree.show(EMBEDDING)} is missing")
  vocab = embedding.shape[0]
  if vocab < config.vocab_size:
    raise ConversionError(f"{items_path}: leaf {embedding.name} has {vocab} rows, fewer than {config_source}'s"
                          f" vocab_size {config.vocab_size}")
  if options.target_vocab_size not in (None, vocab):
    raise ConversionError(f"--target_vocab_size={options.target_vocab_size}: {items_path} holds a vocabulary of"
                          f" {vocab} rows, which laying it out again keeps")
  warnings = model.warnings()
  stored_scan = record.scan_layers
  if stored_scan is None:
    stored_scan = model.stored_scanned(name.split("/") for name in source.tensors)
    warnings.append(f"no scan_layers in the checkpoint metadata; {'scanned' if stored_scan else 'unscanned'}"
                    " layers found in the tree")
  layers = _source_layers(model.layout(vocab, stored_scan))
  merge = None
  if lora_checkpoint_path:
    merge = lora_export.plan_merge(lora_checkpoint_path, ReverseOptions(lora_alpha=lora_alpha), model.family.name,
                                   model.target, (hf_config, config_source))
    source = dataclasses.replace(source, lora=merge.record())
  builder = _Leaves(source, model.config.path, np.dtype(options.save_dtype), "scanned" if stored_scan else
                    "unscanned", merge)
  layout = model.layout(vocab, options.scan_layers)
  leaves = [leaf for maxtext, params in plan_lib.by_leaf(layout.top).items() for leaf in builder.top(maxtext, params)]
  for group in layout.groups:
    leaves.extend(builder.group(group.resolved(), layers))
  if merge is not None and builder.merged != set(merge.weights):
    missed = sorted(set(merge.weights) - builder.merged)
    raise ConversionError(f"{merge.export.items_path}: {len(missed)} LoRA module(s) whose kernel the base does not"
                          f" hold: {', '.join(missed[:5])}")
  unused = sorted(set(source.tensors) - builder.used)
  if unused:
    raise ConversionError(f"{items_path}: {len(unused)} leaf/leaves that {model.family.name} ({model.target}) does"
                          f" not know: {', '.join(unused[:5])}{' ...' if len(unused) > 5 else ''}")
  leaves = [plan_lib.chunked(leaf, options.chunking) for leaf in leaves]
  return plan_lib.Plan(model, source, vocab, options.scan_layers, np.dtype(options.save_dtype), tuple(leaves), (),
                       tuple(warnings), fp8, options.chunking)


class _Leaves:
  """The output's leaves, each read from the source's leaves (`used`: the source paths read)."""

  def __init__(self, source: MaxTextSource, config_path: str, save_dtype: np.dtype, stored: str,
               merge: lora_export.Merge | None):
    self._source = source
    self._config_path = config_path
    self._save_dtype = save_dtype
    self._stored = stored
    self._merge = merge
    self.used: set[str] = set()
    self.merged: set[str] = set()  # The HF weights whose LoRA update went into a kernel.

  def _tensor(self, path: str, fixed: tuple[tuple[int, int], ...], expected: Shape | None) -> MaxTextTensor:
    """The source leaf at `path` (one layer of it at `fixed`), checked to have the `expected` shape (a scale
    leaf's, None: its kernel's was checked)."""
    tensor = self._source.tensors.get(path)
    shown = self._source.tree.show(path.split("/"))
    if tensor is None:
      raise ConversionError(f"{self._source.location}: leaf {shown} is missing; the {self._stored} checkpoint of"
                            f" {self._config_path} needs it")
    tensor = tensor.at(fixed)
    if expected is not None and tensor.shape != tuple(expected):
      raise ConversionError(f"{self._source.location}: leaf {shown} has {'a layer' if fixed else 'shape'}"
                            f" {tensor.shape}, but {self._config_path} implies {tuple(expected)}")
    self.used.add(path)
    return tensor

  def _dtype(self, params: list[Param], tensor: MaxTextTensor) -> np.dtype:
    """--save_dtype; or float32 for a leaf whose params keep the float32 the checkpoint stores; or an FP8 kernel's
    own dtype (its bytes are kept)."""
    if all(p.keep_float32 for p in params) and tensor.dtype == np.float32:
      return np.dtype(np.float32)
    if "float8" in tensor.dtype.name:
      return tensor.dtype
    return self._save_dtype

  def _scale(self, path: str) -> MaxTextTensor | None:
    """The `_scale` leaf of a native fp8 kernel at `path`, if the source has one."""
    tensor = self._source.tensors.get(path + "_scale")
    return tensor if tensor is not None and "float8" in self._source.tensors[path].dtype.name else None

  def _adapted(self, params: list[Param], group: LayerGroup) -> dict[int, lora_export.AdapterModule]:
    """The LoRA module of each layer whose value of this leaf it adapts."""
    if self._merge is None or len(params) != 1:
      return {}
    param = params[0]
    modules = {}
    for _, layer in group.positions():
      weight = param.hf.format(layer=param.hf_layer(layer))
      if weight in self._merge.weights:
        modules[layer] = self._merge.weights[weight]
        self.merged.add(weight)
    return modules

  def _merged(self, module: lora_export.AdapterModule | None, tensor: MaxTextTensor, dtype: np.dtype):
    """A layer's copy, with the module's update added in float32 where the LoRA checkpoint adapts it."""
    if module is None:
      return Copy(tensor, dtype)
    export = self._merge.export
    layer = tuple((axis, i) for axis, i in enumerate(module.index) if isinstance(i, int))
    factors = []
    for keys in (module.leaf_a, module.leaf_b):
      stored = self._merge.reader.arrays[keys]
      factors.append(MaxTextTensor(export.items_path, keys, stored.shape, stored.dtype).at(layer))
    return AddLowRank(Copy(tensor, np.dtype(np.float32)), *factors, export.alpha / export.rank,
                      len(module.sides.in_shape), dtype)

  def top(self, maxtext: str, params: list[Param]) -> list[plan_lib.Leaf]:
    leaves = []
    for path, expected in ((maxtext, _per_layer_shape(params[0])), (maxtext + "_scale", None)):
      if expected is None and self._scale(maxtext) is None:
        break
      tensor = self._tensor(path, (), expected)
      dtype = np.dtype(np.float32) if expected is None else self._dtype(params, tensor)
      leaves.append(plan_lib.Leaf(tuple(path.split("/")), tensor.shape, dtype, (tensor.name,), Copy(tensor, dtype),
                                  plan_lib.leaf_axes(params[0], len(tensor.shape))))
    return leaves

  def group(self, group: LayerGroup, layers: dict[tuple[str, int], _Located]) -> list[plan_lib.Leaf]:
    leaves = []
    for maxtext, params in plan_lib.by_leaf(group.params).items():
      expected = _per_layer_shape(params[0])
      located = {}
      for _, layer in group.positions():
        if (maxtext, layer) not in layers:
          raise ConversionError(f"{self._source.location}: the {self._stored} checkpoint has no layer {layer} of"
                                f" {maxtext}")
        located[layer] = layers[(maxtext, layer)]
      leaves.append(self._group_leaf(group, maxtext, params, located, expected, self._adapted(params, group)))
      if self._scale(next(iter(located.values()))[0]) is not None:
        scales = {layer: (p + "_scale", fixed) for layer, (p, fixed) in located.items()}
        leaves.append(self._group_leaf(group, maxtext + "_scale", params, scales, None, {}))
    return leaves

  def _group_leaf(self, group: LayerGroup, maxtext: str, params: list[Param], located: dict[int, _Located],
                  expected: Shape | None, adapted: dict[int, lora_export.AdapterModule]) -> plan_lib.Leaf:
    """The output leaf `maxtext` of `group`, its layers `located` in the source; `expected` None: a native fp8
    kernel's scale leaf (float32, its layers' shapes those the source stores)."""
    path = (*group.path, *maxtext.split("/"))
    axis = params[0].scan_axis
    dtype_of = (lambda t: np.dtype(np.float32)) if expected is None else (lambda t: self._dtype(params, t))
    whole = None if adapted else _whole_leaf(group, path, located, axis)
    if whole is not None:
      stacking = group.stacking if group.stacked else ()
      tensor = self._tensor(whole, (), None if expected is None else
                            expected[:axis] + stacking + expected[axis:] if stacking else expected)
      dtype = dtype_of(tensor)
      loader, shape, names = Copy(tensor, dtype), tensor.shape, (tensor.name,)
    else:
      per_layer = {layer: self._tensor(p, fixed, expected) for layer, (p, fixed) in located.items()}
      dtype = dtype_of(next(iter(per_layer.values())))
      parts = {layer: (self._merged(adapted.get(layer), t, dtype), t.shape) for layer, t in per_layer.items()}
      names = tuple(dict.fromkeys(t.name for t in per_layer.values()))
      loader, shape = plan_lib.stack_layers(group, parts, axis, dtype)
    return plan_lib.Leaf(path, shape, dtype, names, loader, plan_lib.group_leaf_axes(group, params[0], len(shape)))


def _whole_leaf(group: LayerGroup, path: tuple[str, ...], located: dict[int, _Located], axis: int) -> str | None:
  """The source leaf that already holds the output leaf whole: the same path, its layers at the same positions."""
  name = "/".join(path)
  if not group.stacked:
    (source_path, fixed), = located.values()
    return source_path if source_path == name and not fixed else None
  for position, layer in group.positions():
    source_path, fixed = located[layer]
    if source_path != name or fixed != _stacked_at(axis, position):
      return None
  return name
