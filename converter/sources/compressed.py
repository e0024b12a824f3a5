"""compressed-tensors checkpoints (`quant_method: compressed-tensors`), read as the floating tensors they encode.

The container of vLLM's llm-compressor, in which Kimi K2-Thinking, K2.5 and K2.6 ship their routed experts (INT4)
and many other checkpoints their linear weights (FP8, INT8, INT4). `quantization_config.config_groups` gives each
group of modules a weight scheme (type, bits, strategy, symmetric); `targets` say which modules (a module name, a
"re:" regex of names, or a class name such as "Linear"), `ignore` which modules stay unquantized, `format` (per
group, or for all) how a quantized module's weight is stored:

- `pack-quantized` (integer codes): `X.weight_packed` I32 (out, ceil(in / (32 / bits))), each row's codes packed
  along the input axis, element c of a row in word c // per at bits bits * (c % per) (low bits first, words
  little-endian), holding `q + 2^(bits - 1)`; `X.weight_scale` per the strategy; `X.weight_shape` (2,) = [out, in].
  compressed-tensors 0.20.0's `pack_to_int32` / `unpack_from_int32`.
- `int-quantized`: `X.weight` I8 codes `q`; `float-quantized`: `X.weight` F8_E4M3 codes; both beside `X.weight_scale`.

Fused experts (one tensor for every expert of a projection, as transformers 5 and llm-compressor's repack store
them) have a leading experts axis on every tensor: codes (experts, out, words or in), `weight_shape` (3,), scales
(experts, ...) per expert, or one (1,) for all with the tensor strategy; compressed-tensors 0.20.0 packs and
scales each expert's slice as a Linear's. They are presented under the fused parameter's own name
(`mlp.experts.gate_up_proj`, not `.weight`), which is the name the families read dense fused experts by.

Every strategy is one scale per block of the weight's (rows, columns): `group` (1, group_size), `channel`
(1, in), `tensor` (out, in), `block` (`block_structure`); so `W = float32(q) * float32(scale)` per block, computed
in float32 (INT4 codes times a BF16 scale need 11 significant bits: exact in float32, not in bfloat16) and rounded
once to the dtype asked for (scaled.py). Asymmetric schemes (zero points), activation-ordered groups (`g_idx`),
other formats (NVFP4, 2:4 sparse, Marlin) and transforms are refused by name before anything is written.
Activation scales of static schemes (`X.input_scale`, the kv cache's `k_scale` / `v_scale`) describe the runtime,
not the weights, and are not tensors of the model.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Mapping

import numpy as np

from converter.errors import ConversionError
from converter.sources import fp8, scaled
from converter.sources.base import QuantizedSource, Region, SourceTensor
from converter.sources.safetensors import SafetensorsSource, TensorInfo

QUANT_METHOD = "compressed-tensors"
PACKED = "pack-quantized"
INT = "int-quantized"
FLOAT = "float-quantized"
FORMATS = (PACKED, INT, FLOAT)
STRATEGIES = ("tensor", "channel", "group", "block")
SCALE_DTYPES = ("F32", "BF16", "F16")
PACKED_BITS = (2, 4, 8)  # Whole codes in a byte: decoded through one table of the byte's codes.
_ACTIVATION_SCALES = re.compile(r".*\.(input_scale|input_zero_point|output_scale|k_scale|v_scale)$")
_checked_shapes: set[tuple[str, str]] = set()  # (file, weight_shape) this process has read and found as planned.


@dataclasses.dataclass(frozen=True)
class Scheme:
  """One config group's weight scheme, checked: what a quantized module's stored tensors must be."""

  group: str
  format: str
  type: str
  bits: int
  strategy: str
  group_size: int
  block_structure: tuple[int, int]

  def block(self, shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, columns) of the weight (its last two axes) that share one scale."""
    out, inputs = shape[-2:]
    return {"tensor": (max(out, 1), max(inputs, 1)), "channel": (1, max(inputs, 1)), "group": (1, self.group_size),
            "block": self.block_structure}[self.strategy]

  def describe(self) -> str:
    what = {"group": f"groups of {self.group_size}", "block": "{}x{} blocks".format(*self.block_structure)}
    return f"{self.type}{self.bits} {self.format}, {what.get(self.strategy, self.strategy)} scales"


def _code_table(bits: int) -> np.ndarray:
  """Every byte's `8 / bits` signed codes in float32, lowest bits first: `q = n - 2^(bits - 1)`."""
  per = 8 // bits
  byte = np.arange(256)[:, None] >> (bits * np.arange(per))[None, :]
  return ((byte & ((1 << bits) - 1)) - (1 << (bits - 1))).astype(np.float32)


_TABLES = {bits: _code_table(bits) for bits in PACKED_BITS}


@dataclasses.dataclass(frozen=True)
class CompressedTensor:
  """A quantized Linear's stored codes and scales, presented as its float32 weight (out, in); or fused experts'
  (experts, out, in), every expert's slice a Linear's."""

  name: str
  codes: TensorInfo
  scale: TensorInfo
  scheme: Scheme
  shape: tuple[int, ...]
  # pack-quantized's `weight_shape`: the shape above is its layout's (compressed_tensors_source), checked against
  # this tensor's own before its values are first read.
  stored_shape: TensorInfo | None = None

  @property
  def dtype(self) -> np.dtype:
    return np.dtype(np.float32)

  @property
  def format(self) -> str:
    return f"{self.scheme.describe()} ({self.codes.dtype_code} x {self.scale.dtype_code})"

  @property
  def files(self) -> tuple[str, ...]:
    return tuple(dict.fromkeys(t.path for t in self._stored))

  @property
  def stored_names(self) -> tuple[str, ...]:
    return tuple(t.name for t in self._stored)

  @property
  def byte_ranges(self) -> tuple[tuple[str, int, int], ...]:
    return tuple(r for t in self._stored for r in t.byte_ranges)

  @property
  def _stored(self) -> tuple[TensorInfo, ...]:
    return (self.codes, self.scale) + ((self.stored_shape,) if self.stored_shape is not None else ())

  def read(self, dtype: np.dtype | None = None, region: Region = (), transpose: bool = False) -> np.ndarray:
    self._check_stored_shape()
    return scaled.read_scaled(self.shape, region, self.dtype if dtype is None else dtype, transpose,
                              self.scheme.block(self.shape), self._read_codes, self._read_scales)

  def _read_codes(self, lead: tuple[slice, ...], rows: slice, cols: slice) -> np.ndarray:
    if self.scheme.format == FLOAT:
      return fp8.to_float32(self.codes.read(None, (*lead, rows, cols)))
    if self.scheme.format == INT:
      return self.codes.read(np.float32, (*lead, rows, cols))
    per = 32 // self.scheme.bits
    first = cols.start // per
    words = self.codes.read(None, (*lead, rows, slice(first, -(-cols.stop // per))))
    return scaled.decode_bytes(words.astype("<i4", copy=False), _TABLES[self.scheme.bits], cols.start - first * per,
                               cols.stop - cols.start)

  def _check_stored_shape(self) -> None:
    info = self.stored_shape
    if info is None or (info.path, info.name) in _checked_shapes:
      return
    stored = tuple(int(d) for d in info.read())
    if stored != self.shape:
      raise ConversionError(
          f"{info.path}: {info.name!r} says the weight is {list(stored)}, but {self.codes.name!r} {self.codes.shape}"
          f" and {self.scale.name!r} {self.scale.shape} are stored as the weights of that layout are, which are"
          f" {list(self.shape)}: a checkpoint stores one shape per layout")
    _checked_shapes.add((info.path, info.name))

  def _read_scales(self, lead: tuple[slice, ...], row_blocks: slice, col_blocks: slice) -> np.ndarray:
    if self.scheme.strategy == "tensor":  # One scale, for every expert too (compressed-tensors 0.20.0's (1,)).
      return self.scale.read(np.float32).reshape((1,) * (len(lead) + 2))
    return self.scale.read(np.float32, (*lead, row_blocks, col_blocks))


def _path(group: str, key: str) -> str:
  return f"quantization_config.config_groups.{group}.weights.{key}"


def _scheme(group: str, weights: Any, default_format: Any, config_path: str) -> Scheme:
  """The group's weight scheme, stored in `default_format` (the group's own `format`, else the config's), or a
  ConversionError naming the key it cannot read exactly."""
  if not isinstance(weights, Mapping):
    raise ConversionError(f"{config_path}: {_path(group, '')[:-1]} is {weights!r}; expected the weights' scheme")

  def refuse(key: str, why: str) -> ConversionError:
    return ConversionError(f"{config_path}: {_path(group, key)} {weights.get(key)!r}: {why}")

  kind, bits, strategy = weights.get("type"), weights.get("num_bits"), weights.get("strategy")
  fmt = default_format
  if fmt not in FORMATS:
    raise ConversionError(f"{config_path}: quantization_config format {fmt!r} (group {group}) is not supported;"
                          f" supported: {', '.join(FORMATS)}")
  if strategy not in STRATEGIES:
    raise refuse("strategy", f"not supported; supported: {', '.join(STRATEGIES)}")
  if weights.get("symmetric") is False:
    raise refuse("symmetric", "asymmetric weights (zero points) are not supported")
  if weights.get("actorder") not in (None, "static"):
    raise refuse("actorder", "activation-ordered groups (a g_idx per input) are not supported")
  if weights.get("dynamic"):
    raise refuse("dynamic", "weights quantized at run time have nothing stored to read")
  wanted = {PACKED: ("int", PACKED_BITS), INT: ("int", (8,)), FLOAT: ("float", (8,))}[fmt]
  if kind != wanted[0]:
    raise refuse("type", f"format {fmt} stores {wanted[0]} weights")
  if bits not in wanted[1]:
    raise refuse("num_bits", f"format {fmt} is read with {' or '.join(map(str, wanted[1]))} bits")
  group_size, block_structure = 0, (0, 0)
  if strategy == "group":
    group_size = weights.get("group_size")
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size <= 0:
      raise refuse("group_size", "the group strategy needs a positive group size")
  if strategy == "block":
    block = weights.get("block_structure")
    if (not isinstance(block, (list, tuple)) or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
      raise refuse("block_structure", "the block strategy needs [rows, columns] of positive integers")
    block_structure = (int(block[0]), int(block[1]))
  return Scheme(group, fmt, kind, int(bits), strategy, int(group_size), block_structure)


def _matches(name: str, target: str) -> bool:
  return target[3:] and re.match(target[3:], name) is not None if target.startswith("re:") else target == name


class _Targets:
  """Which config group, if any, quantizes a module (compressed-tensors' precedence: its name, a regex of names,
  then a class name such as "Linear", which a checkpoint's tensors cannot show and so matches any quantized
  module)."""

  def __init__(self, groups: Mapping[str, tuple[Scheme, tuple[str, ...]]], ignore: tuple[str, ...]):
    self.groups = groups
    self.ignore = ignore

  def ignored(self, module: str) -> bool:
    return any(_matches(module, t) for t in self.ignore)

  def scheme(self, module: str) -> Scheme | None:
    for tier in (lambda t: t == module, lambda t: t.startswith("re:") and _matches(module, t), _is_class_name):
      found = [s for s, targets in self.groups.values() if any(tier(t) for t in targets)]
      if len({dataclasses.replace(s, group="") for s in found}) > 1:
        raise ConversionError(f"module {module!r} is a target of config groups"
                              f" {', '.join(s.group for s in found)} with different weight schemes")
      if found:
        return found[0]
    return None


def _is_class_name(target: str) -> bool:
  return not target.startswith("re:") and target[:1].isupper() and "." not in target


def _targets(quantization: Mapping[str, Any], config_path: str) -> _Targets:
  for key, why in (("transform_config", "weights rotated by transforms"), ("sparsity_config", "sparse weights")):
    value = quantization.get(key)
    if value and not (key == "sparsity_config" and value.get("format") in (None, "dense")):
      raise ConversionError(f"{config_path}: quantization_config.{key} is set ({why}); not supported")
  status = quantization.get("quantization_status")
  if status not in (None, "compressed"):
    raise ConversionError(f"{config_path}: quantization_config.quantization_status {status!r}: only compressed"
                          " checkpoints store their weights as the format says")
  config_groups = quantization.get("config_groups")
  if not isinstance(config_groups, Mapping) or not config_groups:
    raise ConversionError(f"{config_path}: quantization_config.config_groups is {config_groups!r}; expected a"
                          " mapping of groups with weights schemes and targets")
  groups: dict[str, tuple[Scheme, tuple[str, ...]]] = {}
  for group, entry in config_groups.items():
    targets = entry.get("targets") if isinstance(entry, Mapping) else None
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
      raise ConversionError(f"{config_path}: quantization_config.config_groups.{group}.targets is {targets!r};"
                            " expected a list of module names, \"re:\" regexes or class names")
    if entry.get("weights") is None:
      continue  # Activations only: the weights are stored as they are.
    # A mixed-precision checkpoint names each group's format beside its scheme.
    fmt = entry.get("format") or quantization.get("format")
    groups[group] = (_scheme(group, entry["weights"], fmt, config_path), tuple(targets))
  ignore = quantization.get("ignore") or []
  if not isinstance(ignore, list) or not all(isinstance(t, str) for t in ignore):
    raise ConversionError(f"{config_path}: quantization_config.ignore is {ignore!r}; expected a list of names")
  return _Targets(groups, tuple(ignore))


def _expected_scale(scheme: Scheme, shape: tuple[int, ...]) -> tuple[int, ...]:
  br, bc = scheme.block(shape)
  return {"tensor": (1,)}.get(scheme.strategy, (*shape[:-2], math.ceil(shape[-2] / br), math.ceil(shape[-1] / bc)))


def presented_name(module: str, ndim: int) -> str:
  """A Linear's `X.weight`; fused experts' (3-D) the parameter itself, `X`: HF stores fused experts as parameters
  of the experts module (`mlp.experts.gate_up_proj`), and llm-compressor's repack of compressed experts nests the
  quantized tensors under that name (`mlp.experts.gate_up_proj.weight_packed`)."""
  return module if ndim == 3 else f"{module}.weight"


def _weight(module: str, scheme: Scheme, stored: Mapping[str, TensorInfo], shapes: Mapping[str, tuple[int, ...]],
            config_path: str) -> CompressedTensor:
  """The module's stored tensors as one weight, after checking them against the scheme and each other."""
  codes_name = f"{module}.weight_packed" if scheme.format == PACKED else f"{module}.weight"
  codes = stored[codes_name]
  scale = stored.get(f"{module}.weight_scale")
  where = f"{codes.path}: {codes_name!r} ({scheme.describe()}, config group {scheme.group} in {config_path})"
  if scale is None:
    raise ConversionError(f"{where} has no {module + '.weight_scale'!r}: its values cannot be read without scales")
  for extra in ("weight_zero_point", "weight_g_idx"):
    if f"{module}.{extra}" in stored:
      raise ConversionError(f"{where} has a {extra}, which a symmetric scheme without activation order never has")
  if scale.dtype_code not in SCALE_DTYPES:
    raise ConversionError(f"{scale.path}: scale {scale.name!r} is {scale.dtype_code}; expected one of"
                          f" {', '.join(SCALE_DTYPES)}")
  wanted = {PACKED: ("I32",), INT: ("I8",), FLOAT: ("F8_E4M3",)}[scheme.format]
  if codes.dtype_code not in wanted or len(codes.shape) not in (2, 3):
    raise ConversionError(f"{where} is {codes.dtype_code} {codes.shape}; expected a 2-D {' or '.join(wanted)} tensor"
                          " (a Linear's), or a 3-D one (fused experts')")
  if len(codes.shape) == 3 and scheme.strategy == "block":
    raise ConversionError(f"{where} holds fused experts (3-D) in {scheme.describe()}: compressed-tensors writes"
                          " fused experts with group, channel or tensor scales only")
  stored_shape = stored[f"{module}.weight_shape"] if scheme.format == PACKED else None  # Checked by _read_shapes.
  shape = codes.shape
  if scheme.format == PACKED:
    shape = shapes[module]
    words = -(-shape[-1] // (32 // scheme.bits)) if len(shape) == len(codes.shape) else None
    if words is None or min(shape) <= 0 or codes.shape != (*shape[:-1], words):
      packed = (*shape[:-1], words) if words is not None else "of another rank"
      raise ConversionError(f"{stored_shape.path}: {stored_shape.name!r} says the weight is {list(shape)}, but"
                            f" {codes_name!r} is {codes.shape}: {scheme.bits}-bit codes of that weight, packed"
                            f" {32 // scheme.bits} to an int32 along its rows, would be {packed}")
  expected = _expected_scale(scheme, shape)
  if scale.shape != expected and not (scheme.strategy == "tensor" and math.prod(scale.shape) == 1):
    raise ConversionError(f"{scale.path}: scale {scale.name!r} is {scale.shape}, but {codes_name!r} {codes.shape}"
                          f" holds a weight {list(shape)} whose {scheme.describe()} need {expected}")
  return CompressedTensor(presented_name(module, len(shape)), codes, scale, scheme, tuple(shape), stored_shape)


def _stored_shape_info(stored: Mapping[str, TensorInfo], module: str) -> TensorInfo:
  info = stored.get(f"{module}.weight_shape")
  packed = stored[module + ".weight_packed"]
  rank = len(packed.shape)
  if info is None or info.dtype_code not in ("I32", "I64") or info.shape != (rank,):
    found = "nothing" if info is None else f"{info.dtype_code} {info.shape}"
    raise ConversionError(f"{packed.path}: {module + '.weight_packed'!r} {packed.shape} needs"
                          f" {module + '.weight_shape'!r}, I32 or I64 of shape ({rank},)"
                          f" ({'[experts, out, in]' if rank == 3 else '[out, in]'}); found {found}")
  return info


def _read_shapes(stored: Mapping[str, TensorInfo], modules: Mapping[str, Scheme]) -> dict[str, tuple[int, ...]]:
  """Every packed module's shape: the `weight_shape` of the first module of each stored layout (words, scales and
  scheme alike: three for Kimi K2's 69,120 experts) read now, the others' read when each is first read
  (`CompressedTensor.read`). Reading all of them here took 12 s to 3 minutes for Kimi-K2.6 from local files
  (69,120 page faults over 139 shards), and would be 69,120 requests from a bucket, before planning."""
  first_of_layout: dict[tuple, str] = {}
  layout_of: dict[str, tuple] = {}
  for module, scheme in modules.items():
    info = _stored_shape_info(stored, module)
    scale = stored.get(module + ".weight_scale")
    layout_of[module] = (stored[module + ".weight_packed"].shape, scale.shape if scale is not None else None, scheme)
    first_of_layout.setdefault(layout_of[module], info.name)
  read = {name: tuple(int(d) for d in stored[name].read()) for name in first_of_layout.values()}
  return {module: read[first_of_layout[layout]] for module, layout in layout_of.items()}


def compressed_tensors_source(plain: SafetensorsSource, quantization: Mapping[str, Any],
                              config_path: str) -> QuantizedSource:
  """Every quantized module's stored tensors presented as its weight; the rest as stored."""
  targets = _targets(quantization, config_path)
  schemes: dict[str, Scheme] = {}
  for name, info in plain.tensors.items():
    module = name.removesuffix(".weight_packed") if name.endswith(".weight_packed") else None
    if module is None and name.endswith(".weight") and info.dtype_code in ("I8", "F8_E4M3", "F8_E5M2"):
      module = name.removesuffix(".weight")
    if module is None:
      continue
    if targets.ignored(module):
      raise ConversionError(f"{info.path}: {name!r} is stored quantized ({info.dtype_code}), but"
                            f" quantization_config.ignore in {config_path} leaves module {module!r} unquantized")
    try:
      scheme = targets.scheme(module)
    except ConversionError as e:
      raise ConversionError(f"{config_path}: {e}") from None
    if scheme is None:
      raise ConversionError(f"{info.path}: {name!r} is stored quantized ({info.dtype_code}), but no config group of"
                            f" quantization_config in {config_path} targets module {module!r}")
    if (scheme.format == PACKED) != name.endswith(".weight_packed"):
      raise ConversionError(f"{info.path}: {name!r} ({info.dtype_code}) is not stored as config group"
                            f" {scheme.group}'s format {scheme.format} says")
    schemes[module] = scheme
  shapes = _read_shapes(plain.tensors, {m: s for m, s in schemes.items() if s.format == PACKED})
  weights = {w.name: w for w in (_weight(m, s, plain.tensors, shapes, config_path) for m, s in schemes.items())}
  consumed = {n for w in weights.values() for n in w.stored_names}
  tensors: dict[str, SourceTensor] = {}
  for name, info in plain.tensors.items():
    if name in consumed or _ACTIVATION_SCALES.match(name):
      continue
    if re.match(r".*\.weight_(packed|scale|shape|zero_point|g_idx)$", name):
      module = name.rsplit(".", 1)[0]
      raise ConversionError(f"{info.path}: {name!r} belongs to a quantized weight, but neither"
                            f" {module + '.weight_packed'!r} nor a quantized {module + '.weight'!r} is stored")
    if name in weights:
      raise ConversionError(f"{info.path}: {name!r} is stored both as it is and quantized (beside"
                            f" {weights[name].codes.name!r}): which one is the model's is ambiguous")
    tensors[name] = info
  tensors.update(weights)
  return QuantizedSource(plain.location, tensors, tuple(plain.files), QUANT_METHOD)
