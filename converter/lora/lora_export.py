"""MaxText LoRA checkpoints (qwix) read as PEFT LoRA factors, derived from the family layouts: planned for the export
as an adapter (converter/reverse/lora_adapter.py) and for merging into a base (`plan_merge`).

MaxText 0.2.5 trains LoRA through qwix's `LoraProvider`: beside each adapted kernel K (a DenseGeneral weight, the
family's ops applied to HF's (out, in) weight) it keeps `<kernel>_lora_a` (prod(contracting axes), r) and
`<kernel>_lora_b` (r, prod(other axes)), the layer axis of a scanned leaf at the kernel's scan axis
(measured: query (E, H, D) -> lora_a (E, r), lora_b (r, H*D); scanned (E, L, r), (r, L, H*D)), and adds
`(alpha / r) * x @ lora_a @ lora_b` to the kernel's output. Its checkpoints hold those leaves alone, under
`params/params/...` (Linen layout) or as NNX state (`.../kernel_lora_a/value`), with `lora_rank` / `lora_alpha` in
the step's custom_metadata (`lora`).

PEFT's factors are A (r, in) and B (out, r) of the HF weight. The kernel's contracting axes are HF's input
(the family's ops transpose first, then at most reshape each side, permute within the output side (RoPE
interleave) or scale it (query scaling)), so A = lora_a.T, and B is lora_b with the output-side ops undone:
`kernel_sides` reads that structure from the family's `Param`, and `peft_factors` / `qwix_factors` convert
both ways, with no per-family code. Anything else (experts, slots of a shared leaf, a fused HF tensor) is refused.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator

import numpy as np

from converter import families
from converter.arrays import Shape
from converter.errors import ConversionError
from converter.families import Param
from converter.model_config import check_claimed_counts, parse_model_config
from converter.ops import DivideInFloat32, InterleaveRope, Op, Reshape, ScaleInFloat32, Transpose
from converter.options import ReverseOptions
from converter.checkpoint_format.record import ConversionRecord, original_config, recorded_field, step_custom_metadata
from converter.checkpoint_format.layout import items_path_of
from converter.families import leaf_index
from converter.sources.lora import add_update
from converter.sources.maxtext import linen_keys

LORA_A_SUFFIX, LORA_B_SUFFIX = "_lora_a", "_lora_b"
_OUT_SIDE_OPS = (InterleaveRope, ScaleInFloat32, DivideInFloat32)  # Each acts on the last axis or elementwise.


@dataclasses.dataclass(frozen=True)
class KernelSides:
  """A kernel made from an HF (out, in) weight: its leading axes from HF's input, the rest from its output, and the
  ops that act on the output side after the transpose (in order)."""

  in_shape: Shape
  out_shape: Shape
  out_ops: tuple[Op, ...]


def kernel_sides(param: Param) -> KernelSides:
  """How `param`'s ops turn its HF weight into the kernel; ValueError when they do more than transpose, reshape
  each side and permute or scale the output side."""
  if param.experts or param.leaf_slot is not None or len(param.hf_shape) != 2:
    raise ValueError("not one HF linear weight per kernel (experts, or one slot of a shared leaf)")
  if not param.ops or not isinstance(param.ops[0], Transpose):
    raise ValueError("the kernel is not the transposed HF weight")
  out_dim, in_dim = param.hf_shape
  in_shape, out_shape, out_ops = (in_dim,), (out_dim,), []
  for op in param.ops[1:]:
    if isinstance(op, Reshape) and not out_ops:
      split = next((k for k in range(1, len(op.new_shape)) if math.prod(op.new_shape[:k]) == in_dim), None)
      if split is None or math.prod(op.new_shape[split:]) != out_dim:
        raise ValueError(f"{op} does not keep the input and output sides apart")
      in_shape, out_shape = tuple(op.new_shape[:split]), tuple(op.new_shape[split:])
    elif isinstance(op, _OUT_SIDE_OPS):
      out_ops.append(op)
    else:
      raise ValueError(f"{op} is not a layout op of one side of the kernel")
  return KernelSides(in_shape, out_shape, tuple(out_ops))


def peft_factors(sides: KernelSides, lora_a: np.ndarray, lora_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """qwix's (in, r) and (r, out) factors of one layer's kernel as PEFT's A (r, in) and B (out, r)."""
  rank = lora_a.shape[-1]
  value = lora_b.reshape((rank, *sides.out_shape))
  for op in reversed(sides.out_ops):
    value = op.inverse(value.shape)(value)
  return np.ascontiguousarray(lora_a.T), np.ascontiguousarray(value.reshape(rank, -1).T)


def qwix_factors(sides: KernelSides, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """PEFT's A (r, in) and B (out, r) as qwix's factors of the kernel: (prod(in axes), r), (r, prod(out axes))."""
  rank = a.shape[0]
  value = np.ascontiguousarray(b.T).reshape((rank, *sides.out_shape))
  for op in sides.out_ops:
    value = op(value)
  return np.ascontiguousarray(a.T), value.reshape(rank, -1)


def lora_leaf_key(keys: tuple[str, ...]) -> tuple[str, ...] | None:
  """A stored leaf's path in the Linen tree under params/params (`decoder/layers_0/.../kernel_lora_a`), from any
  layout MaxText saves LoRA leaves in: Linen (`params/params/...`), NNX-SFT (`.../value`, `layers/0`), NNX-RL
  (`base/...`); None for anything that is not a LoRA factor (the step, optimizer state)."""
  if keys[:2] == ("params", "params"):
    keys = keys[2:]
  elif keys[:1] == ("base",):
    keys = keys[1:]
  elif keys[:1] in (("opt_state",), ("optimizer",), ("step",)):
    return None
  if keys and keys[-1] == "value":
    keys = keys[:-1]
  folded = linen_keys(keys)
  if not folded or not folded[-1].endswith((LORA_A_SUFFIX, LORA_B_SUFFIX)):
    return None
  return tuple(folded)


@dataclasses.dataclass(frozen=True)
class AdapterModule:
  """One adapted HF module: its qwix factors' stored leaves (keys of the reader's arrays), the layer's index in
  them, and how its kernel's sides convert."""

  module: str
  leaf_a: tuple[str, ...]
  leaf_b: tuple[str, ...]
  index: tuple[Any, ...]
  sides: KernelSides


@dataclasses.dataclass(frozen=True)
class AdapterExport:
  """What an export writes: every adapted module, at one rank and alpha, in the leaves' dtype."""

  items_path: str
  family: str
  target_model: str
  rank: int
  alpha: float
  modules: tuple[AdapterModule, ...]
  dtype: np.dtype
  base_model: str


def layout_modules(layout) -> Iterator[tuple[Param, tuple[str, ...], tuple[Any, ...], tuple[int, ...], str]]:
  """(param, leaf path of its kernel, index of one layer in it, the leaf's stacking axes, HF module name) for
  every weight of the layout."""
  for param in layout.top:
    yield param, tuple(param.maxtext.split("/")), (), (), param.hf
  for group in layout.groups:
    group = group.resolved()
    stacking = group.stacking if group.stacked else ()
    for param in group.params:
      for position, layer in group.positions():
        index = leaf_index(param, None, position if group.stacked else ())
        yield (param, (*group.path, *param.maxtext.split("/")), index, stacking,
               param.hf.format(layer=param.hf_layer(layer)))


def plan_adapter_export(checkpoint_path: str, options: ReverseOptions, reader=None,
                        base: tuple[dict[str, Any], str] | None = None) -> AdapterExport:
  """Which stored LoRA leaves become which PEFT factors; every leaf and shape checked before anything is written.
  `base`: the config.json dict (and where it came from) of the base the factors go with, when it is known."""
  items_path = items_path_of(checkpoint_path)
  record = ConversionRecord.read(items_path)
  hf_config, source = base or original_config(items_path, record, options.hf_config_path)
  config = parse_model_config(hf_config, source)
  if reader is None:
    from converter.sources.checkpoint_reader import CheckpointReader  # pylint: disable=g-import-not-at-top

    reader = CheckpointReader(items_path)
  leaves = {}
  for keys, array in reader.arrays.items():
    key = lora_leaf_key(keys)
    if key is not None:
      leaves[key] = (keys, array)
  if not leaves:
    raise ConversionError(f"{items_path}: no LoRA leaves (*{LORA_A_SUFFIX} / *{LORA_B_SUFFIX}): not a MaxText LoRA"
                          " checkpoint")
  metadata = step_custom_metadata(items_path)
  lora = metadata.get("lora") if isinstance(metadata.get("lora"), dict) else {}
  alpha = lora.get("lora_alpha") or options.lora_alpha
  if not alpha:
    raise ConversionError(f"{items_path}: the checkpoint's custom_metadata records no lora.lora_alpha (MaxText's"
                          " trainer records it when it saves a LoRA run; other savers may not): pass --lora_alpha,"
                          " the alpha the adapter was trained with")
  if options.lora_alpha and lora.get("lora_alpha") and float(options.lora_alpha) != float(lora["lora_alpha"]):
    raise ConversionError(f"{items_path}: --lora_alpha={options.lora_alpha:g}, but the checkpoint records"
                          f" lora_alpha {lora['lora_alpha']:g}")
  # The rank: recorded, else the last axis of any lora_a leaf (qwix's (contracting, r)).
  rank = lora.get("lora_rank") or next(a.shape[-1] for k, (_, a) in sorted(leaves.items())
                                       if k[-1].endswith(LORA_A_SUFFIX))
  scan_layers = metadata.get("scan_layers")
  if not isinstance(scan_layers, bool):
    scan_layers = any(k[:2] == ("decoder", "layers") for k in leaves)
  check_claimed_counts(config, (a.shape for _, a in leaves.values()), items_path)
  model = families.resolve(config, family=options.family or record.family,
                           family_named_by="--family" if options.family else recorded_field(items_path, "family"),
                           target_model=options.target_model or record.target_model, text_only=True)
  layout = model.layout(config.vocab_size, scan_layers)
  modules, used = [], set()
  for param, kernel, index, stacking, hf_name in layout_modules(layout):
    leaf_a = (*kernel[:-1], kernel[-1] + LORA_A_SUFFIX)
    leaf_b = (*kernel[:-1], kernel[-1] + LORA_B_SUFFIX)
    if leaf_a not in leaves and leaf_b not in leaves:
      continue
    shown = "/".join(leaf_a)
    if leaf_a not in leaves or leaf_b not in leaves:
      raise ConversionError(f"{items_path}: {shown} and its {LORA_B_SUFFIX} sibling must both be stored")
    try:
      sides = kernel_sides(param)
    except ValueError as e:
      raise ConversionError(f"{items_path}: {shown}: {model.family.name}'s {param.maxtext} ({param.hf}) cannot carry a"
                            f" PEFT LoRA adapter: {e}") from e
    axis = param.scan_axis
    expected_a, expected_b = ((*s[:axis], *stacking, *s[axis:]) if stacking else s
                              for s in ((math.prod(sides.in_shape), rank), (rank, math.prod(sides.out_shape))))
    for leaf, expected in ((leaf_a, expected_a), (leaf_b, expected_b)):
      if tuple(leaves[leaf][1].shape) != expected:
        raise ConversionError(f"{items_path}: {'/'.join(leaf)} has shape {tuple(leaves[leaf][1].shape)}, but"
                              f" {param.hf} {tuple(param.hf_shape)} with lora_rank {rank}"
                              f" ({'scanned' if scan_layers else 'unscanned'}) needs {expected}")
    used.update((leaf_a, leaf_b))
    modules.append(AdapterModule(hf_name.removesuffix(".weight"), leaves[leaf_a][0], leaves[leaf_b][0], index, sides))
  unused = sorted("/".join(k) for k in leaves if k not in used)
  if unused:
    raise ConversionError(f"{items_path}: {len(unused)} LoRA leaves that no linear weight of {model.family.name}"
                          f" ({model.target}) with {source} holds: {', '.join(unused[:5])}")
  dtype = np.result_type(*(reader.arrays[m.leaf_a].dtype for m in modules))
  base = hf_config.get("_name_or_path") or (options.hf_config_path or items_path)
  return AdapterExport(items_path, model.family.name, model.target, int(rank), float(alpha), tuple(modules),
                       np.dtype(dtype), str(base))


def read_leaf(reader, leaf: tuple[str, ...], index: tuple[Any, ...]) -> np.ndarray:
  """`index` of the LoRA checkpoint's leaf `leaf` (a CheckpointReader's)."""
  return reader.open(reader.arrays[leaf], index, 64 << 20).read(index)


@dataclasses.dataclass(frozen=True)
class Merge:
  """A MaxText LoRA checkpoint merged into HF weights as they are written back: W + (B A) alpha / r, in float32,
  as the forward direction merges a PEFT adapter (`sources.lora.add_update`)."""

  export: AdapterExport
  reader: Any  # The LoRA checkpoint's CheckpointReader.
  weights: dict[str, AdapterModule]  # By the HF weight each adapts (looked up for every piece written back).

  def record(self) -> dict[str, Any]:
    """What a checkpoint it is merged into records of it (ConversionRecord.lora_adapter)."""
    return {"lora_checkpoint_path": self.export.items_path, "r": self.export.rank, "lora_alpha": self.export.alpha,
            "modules": sorted(m.module for m in self.export.modules)}

  def merged(self, module: AdapterModule, weight: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`weight` (HF's (out, in)) plus the module's update, rounded once to `dtype`."""
    a, b = peft_factors(module.sides, read_leaf(self.reader, module.leaf_a, module.index).astype(np.float32),
                        read_leaf(self.reader, module.leaf_b, module.index).astype(np.float32))
    merged = weight.astype(np.float32)
    add_update(merged, b, a, self.export.alpha / self.export.rank)
    return merged.astype(dtype)


def plan_merge(lora_checkpoint_path: str, options: ReverseOptions, family: str, target_model: str,
               base: tuple[dict[str, Any], str]) -> Merge:
  """The LoRA checkpoint's factors, planned against the base's config, family and target (which a MaxText LoRA
  checkpoint does not record)."""
  from converter.sources.checkpoint_reader import CheckpointReader  # pylint: disable=g-import-not-at-top

  items_path = items_path_of(lora_checkpoint_path)
  reader = CheckpointReader(items_path)
  options = dataclasses.replace(options, family=family, target_model=target_model)
  export = plan_adapter_export(items_path, options, reader, base=base)
  return Merge(export, reader, {f"{m.module}.weight": m for m in export.modules})
