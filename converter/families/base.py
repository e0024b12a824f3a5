"""The vocabulary family files are written in: which HF tensor becomes which MaxText leaf, and how.

A family file describes the tensors outside the layers and, per group of layers, the tensors of one layer;
`converter/planning/plan.py` does the rest (layer stacking for scanned checkpoints, expert stacking, dtype casts, shape
checks) once for every family, and `converter/reverse/` inverts it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from converter.arrays import Shape
from converter.families.runtime import Runtime
from converter.model_config import ModelConfig
from converter.ops import Op

SCAN_AXIS = 1  # MaxText's param_scan_axis: the layer axis of a scanned leaf.
TOWER_SUBTREES = ("vision_encoder", "audio_encoder")  # MaxText's multimodal encoders, beside decoder/.
ROTARY_CACHES = {r".*\.rotary_emb\.inv_freq$": ""}  # Recomputed by every model; nothing to convert.


@dataclasses.dataclass(frozen=True)
class Param:
  """One MaxText leaf made from one HF tensor per layer (with experts: one per expert, or one holding them all).

  `maxtext` is a "/"-joined path under the layer group for layer params, under `params/params` otherwise.
  `hf` may contain "{layer}" and "{expert}". `hf_shape` is the HF tensor's shape; `ops` turn it into the leaf's
  per-layer value. With `experts`, the leaf stacks that many experts on axis 0: one HF tensor per expert
  ("{expert}" in `hf`), or, with `experts_in_tensor`, one HF tensor whose axis 0 already holds them (GPT-OSS,
  Llama 4); then `ops` apply to each expert's slice. A stacked layer group puts its layer axis at `scan_axis`.
  Two params may read one HF tensor (a fused gate/up projection split in two by a leading `Slot` op), and several
  params may write one leaf, each into its `leaf_slot` of the per-layer value (a packed q/k/v/z projection): the
  other direction joins them.
  """

  maxtext: str
  hf: str
  hf_shape: Shape
  ops: tuple[Op, ...] = ()
  experts: int = 0
  experts_in_tensor: bool = False
  scan_axis: int = SCAN_AXIS
  layer_stride: int = 1  # MaxText layer i reads HF layer i * layer_stride + layer_offset (Gemma2 pairs).
  layer_offset: int = 0
  leaf_slot: Op | None = None  # An ops.Slot: where this param's value goes in a leaf it shares with others.
  # A leaf HF has no tensor for, every element this value (`hf` empty, `hf_shape` the per-layer leaf's): MaxText
  # learns a weight HF fixes (DeepSeek V4's mHC norm scales, ones). The other direction checks it holds the value.
  constant: float | None = None
  # MaxText's logical axes of one layer's value where converter/layout/logical_axes.py's table, keyed by the
  # leaf's path, would name them otherwise (DeepSeek V4's wq_a: q_lora, where V3's is q_lora_up_proj).
  logical_axes: tuple[str | None, ...] | None = None
  # Stored in float32 by the checkpoint and computed in float32 by MaxText: kept float32 under a narrower
  # --save_dtype (DeepSeek V4's mHC mixers, sinks, position biases and gate bias: tiny, and rounding them to
  # bfloat16 moved a tiny model's logits by 1.6).
  keep_float32: bool = False

  def hf_layer(self, layer: int) -> int:
    return layer * self.layer_stride + self.layer_offset

  @property
  def part_shape(self) -> Shape:
    """The shape `ops` apply to: one expert's slice when the experts share one HF tensor."""
    return tuple(self.hf_shape[1:]) if self.experts_in_tensor else tuple(self.hf_shape)


@dataclasses.dataclass(frozen=True)
class Alternatives:
  """Params a checkpoint may store in one of several forms (Qwen3.5's experts: one by one as transformers saves
  them, or fused as the hub repos ship them; Qwen3-VL-MoE's fused experts under one name in two axis orders). A
  conversion uses the first form whose HF tensors are all present at the shapes it reads; converting back writes
  the first form."""

  options: tuple[tuple[Param, ...], ...]


@dataclasses.dataclass(frozen=True)
class LayerGroup:
  """Where MaxText keeps some decoder layers (one stacked subtree, layers on the scan axis, or one layer), and
  the params of each of them.

  `layers` are MaxText layer numbers (Gemma 2 holds two HF layers in each). Stacked twice over, it is a tuple of
  blocks of layers: the leaves then have (block, layer in block) on two axes from the scan axis (Qwen3-Next's
  `local_layers`, Gemma 4's `scanned_blocks/local_layers`).
  """

  path: tuple[str, ...]
  layers: tuple[int, ...] | tuple[tuple[int, ...], ...]
  stacked: bool
  params: tuple[Param | Alternatives, ...]
  axis_names: tuple[str, ...] = ()  # MaxText's names of the stacking axes, where not the default (DeepSeek V4).

  def resolved(self, stored: Callable[[str], Shape | None] | None = None) -> LayerGroup:
    """The group with each `Alternatives` replaced by its first form whose HF tensors the checkpoint stores, at the
    shapes the form reads, for the group's first layer (`stored`: a name's stored shape, None when absent); by its
    first form without `stored`."""
    _, first = self.positions()[0]

    def present(option: tuple[Param, ...]) -> bool:
      return all(stored(p.hf.format(layer=p.hf_layer(first), expert=0)) == tuple(p.hf_shape) for p in option)

    params: list[Param] = []
    for param in self.params:
      if isinstance(param, Alternatives):
        chosen = next((o for o in param.options if stored is None or present(o)), param.options[0])
        params.extend(chosen)
      else:
        params.append(param)
    return dataclasses.replace(self, params=tuple(params))

  @property
  def nested(self) -> bool:
    return bool(self.layers) and isinstance(self.layers[0], tuple)

  def positions(self) -> list[tuple[tuple[int, ...], int]]:
    """(position on the stacking axes, layer) for every layer of the group, in storage order."""
    if self.nested:
      return [((b, j), layer) for b, block in enumerate(self.layers) for j, layer in enumerate(block)]
    return [((i,), layer) for i, layer in enumerate(self.layers)]

  @property
  def stacking_names(self) -> tuple[str, ...]:
    """MaxText's logical names of the stacking axes: `layers` (blocks: `layers`, `local_layers`); DeepSeek's
    dense and MoE layer collections name their own; `axis_names` where the family names them."""
    if self.nested:
      return ("layers", "local_layers")
    if self.axis_names:
      return self.axis_names
    return (self.path[-1],) if self.path[-1] in ("dense_layers", "moe_layers") else ("layers",)

  @property
  def stacking(self) -> tuple[int, ...]:
    """The lengths of the stacking axes: (layers,) or (blocks, layers per block)."""
    return (len(self.layers), len(self.layers[0])) if self.nested else (len(self.layers),)


@dataclasses.dataclass(frozen=True)
class Layout:
  top: tuple[Param, ...]
  groups: tuple[LayerGroup, ...]

  @property
  def num_layers(self) -> int:
    return sum(len(g.positions()) for g in self.groups)

  def under(self, prefix: str, old: str = "model.") -> Layout:
    """The same layout with HF names that start with `old` moved under `prefix` instead (a multimodal wrapper's
    text model: `model.layers.0...` -> `language_model.model.layers.0...`)."""
    return self.renamed(lambda name: prefix + name[len(old):] if name.startswith(old) else name)

  def renamed(self, rename: Callable[[str], str]) -> Layout:
    """The same layout with every HF name passed through `rename` (a checkpoint that stores another family's
    tensors under its own names: Weaver's Qwen3-VL)."""

    def move(param):
      if isinstance(param, Alternatives):
        return Alternatives(tuple(tuple(move(p) for p in option) for option in param.options))
      return dataclasses.replace(param, hf=rename(param.hf))

    return Layout(tuple(move(p) for p in self.top),
                  tuple(dataclasses.replace(g, params=tuple(move(p) for p in g.params)) for g in self.groups))


def standard_layer_groups(params: tuple[Param, ...], num_layers: int, scan_layers: bool) -> tuple[LayerGroup, ...]:
  """`decoder/layers` with every layer on the scan axis, or `decoder/layers_{i}`."""
  if scan_layers:
    return (LayerGroup(("decoder", "layers"), tuple(range(num_layers)), True, params),)
  return tuple(LayerGroup(("decoder", f"layers_{i}"), (i,), False, params) for i in range(num_layers))


@dataclasses.dataclass(frozen=True)
class Towers:
  """A multimodal checkpoint's encoders and projectors (vision; audio for Qwen3-Omni) in MaxText's tree.

  Towers never scan in MaxText (`encoderblock_{i}`, `blocks_{i}`, `layers_{i}` whatever `scan_layers` says), so
  every param is a top-level one under `params/params`. `overrides` are the MaxText config keys the towers need
  (`use_multimodal` and the `*_for_vit` / `*_for_audio` keys), in MaxText's names; `owns` maps regexes of the HF
  tensors the towers read to what they are, named when a text-only conversion skips them.
  """

  params: tuple[Param, ...]
  overrides: tuple[tuple[str, Any], ...]
  owns: dict[str, str]

  def renamed(self, rename: Callable[[str], str], owns: dict[str, str]) -> Towers:
    """The same towers with every HF name passed through `rename` and `owns` the regexes of the renamed tensors
    (a checkpoint that stores another family's towers under its own names: Weaver's Qwen3-VL), as
    `Layout.renamed` does for the decoder."""
    return Towers(tuple(dataclasses.replace(p, hf=rename(p.hf)) for p in self.params), self.overrides, owns)


@dataclasses.dataclass(frozen=True)
class Family:
  """A model family: the HF architectures it reads, the MaxText models it can target, and its layout.

  `targets` are MaxText model-name prefixes ("llama3.1" covers llama3.1-8b and llama3.1-70b); `infer_target`
  picks one from config.json; `runtime` says what the chosen target's MaxText computes (its overrides and fixed
  rules); `layout(config, target, target vocab size, scan_layers)` says where every HF tensor goes; `check` returns
  warnings about what the target cannot reproduce (it raises ConversionError for what it must refuse);
  `ignored_tensors` maps regexes of HF tensors the family reads nowhere on purpose to the reason a conversion
  states when it skips some ("" for none: rotary caches); `reads` says which configs of its architectures the
  family converts, where several families read one architecture (Gemma 4's gemma4 and gemma4_small decoders);
  `fp8_unquantized_modules` enables `--keep_fp8` (converter/planning/native_fp8.py);
  `towers(config, target)` describes a multimodal checkpoint's encoders (None: the checkpoint has none, or the
  target has no multimodal form, which
  `check` then says); `tensor_aliases` are (regex, replacement) renames from the other names a checkpoint may
  store its tensors under (transformers' `save_pretrained` and in-memory names) to the ones the layout uses;
  `config_back` rewrites the config.json the way back writes.
  """

  name: str
  architectures: tuple[str, ...]
  targets: tuple[str, ...]
  infer_target: Callable[[ModelConfig], str]
  runtime: Callable[[ModelConfig, str], Runtime]
  layout: Callable[[ModelConfig, str, int, bool], Layout]
  check: Callable[[ModelConfig, str], list[str]] = lambda cfg, target: []
  ignored_tensors: Callable[[ModelConfig], dict[str, str]] = lambda cfg: dict(ROTARY_CACHES)
  reads: Callable[[ModelConfig], bool] = lambda cfg: True
  # The `unquantized_modules` of the target's MaxText fp8 models (`qwen3.5-*-fp8`); None: MaxText has none.
  fp8_unquantized_modules: tuple[str, ...] | None = None
  towers: Callable[[ModelConfig, str], Towers | None] = lambda cfg, target: None
  tensor_aliases: Callable[[ModelConfig], tuple[tuple[str, str], ...]] = lambda cfg: ()
  # The config.json the way back writes, from the original's (its quantization_config already dropped): where the
  # original names remote code for a model transformers runs natively (Kimi K2's `kimi_k2`).
  config_back: Callable[[dict[str, Any]], dict[str, Any]] = lambda config: config

  def target_prefix(self, target_model: str) -> str:
    """The longest declared prefix `target_model` starts with ("llama3.1-8b" -> "llama3.1")."""
    matches = [t for t in self.targets if target_model == t or target_model.startswith(t + "-")]
    return max(matches, key=len) if matches else ""


def leaf_index(param: Param, expert: int | None, position: tuple[int, ...]) -> tuple[Any, ...]:
  """Index of one HF tensor's slice in the leaf: the expert on axis 0, the layer's position on the stacking axes
  (none unstacked; (layer,) or (block, layer in block)) from the param's scan axis."""
  index: list[Any] = [expert] if expert is not None else []
  if position:
    index += [slice(None)] * (param.scan_axis - len(index))
    index[param.scan_axis:param.scan_axis] = list(position)
  return tuple(index)


def leaf_shape(per_tensor: Shape, param: Param, stacking: tuple[int, ...]) -> Shape:
  """The leaf holding `param`: experts first, then (stacked groups) the stacking axes at the param's scan axis;
  a param sharing its leaf fills one slot of it."""
  shape = ((param.experts,) if param.experts else ()) + tuple(per_tensor)
  if param.leaf_slot is not None:
    slot = param.leaf_slot
    axis = slot.axis % len(shape)
    shape = shape[:axis] + (slot.groups * sum(slot.sizes),) + shape[axis + 1:]
  return shape[:param.scan_axis] + stacking + shape[param.scan_axis:]
