"""MaxText -> HuggingFace: a converted (or MaxText-trained) Orbax checkpoint back to HF safetensors.

Derived from the same family descriptions as the forward direction, with no second table: every `Param` of the
family's layout names its MaxText leaf, its HF tensor and the ops between them, and `ops.inverse_ops` undoes
those ops. The layout's layer groups (`decoder/layers`, `layers_{i}`, Gemma 3's blocks, Gemma 2's paired layers)
say which leaf holds which layer; layer stacking (axis 1 of a scanned leaf) and expert stacking (axis 0) are undone
by indexing: each HF tensor is one slice of one leaf, read on its own (converter/checkpoint_reader.py),
transformed, and streamed into the current shard file. Memory: one HF tensor plus one leaf's chunk cache.

The HF config comes from the checkpoint's custom metadata (`hf2maxtext.hf_config`, recorded by the forward
direction) or from `hf_config_path`; it is written back as config.json with its dtype set to the checkpoint's.
Everything is written into a temporary directory next to `output_dir` and renamed into place at the end, so a
failed conversion leaves nothing that looks finished.

Exactness: transposes, reshapes, the RoPE permutation, vocab padding and stacking are undone bit for bit. Query
scaling (llama, mistral, mixtral targets) is float arithmetic, undone within 1 ulp (ops.DivideInFloat32); so is
Gemma's `w + 1` norm storage (within 1 ulp of |w| + 1). Vocab padding rows are dropped.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import re
import shutil
import struct
import tempfile
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import numpy as np
from absl import logging

from converter import families
from converter.errors import ConversionError
from converter.families import Family, LayerGroup, Param
from converter.model_config import ModelConfig, load_model_config
from converter.ops import Op, inverse_ops, is_exact, output_shape
from converter.plan import SCAN_AXIS
from converter.safetensors_reader import SAFETENSORS_DTYPES

if TYPE_CHECKING:  # Imported where used: tools/safetensors_writer uses this module without Orbax or TensorStore.
  from converter.checkpoint_reader import CheckpointReader, OpenArray, StoredArray

Shape = tuple[int, ...]
PARAMS = ("params", "params")  # Where a TrainState-shaped tree keeps the model parameters.
DEFAULT_MAX_SHARD_SIZE = "5GB"
DEFAULT_READ_CACHE_BYTES = 1 << 30
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_SAFETENSORS_CODES = {dtype: code for code, dtype in SAFETENSORS_DTYPES.items()}
_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20,
               "GIB": 2**30, "TIB": 2**40}


def parse_size(size: int | str) -> int:
  """Bytes in "5GB", "500MB", "2GiB" or "123" (decimal units like HF's `max_shard_size`, binary with "i")."""
  if isinstance(size, int) and not isinstance(size, bool):
    value = size
  else:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(size))
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _SIZE_UNITS:
      raise ConversionError(f"--max_shard_size={size!r}: expected a size such as 5GB, 500MB, 2GiB or a byte count")
    value = int(float(match.group(1)) * _SIZE_UNITS[unit])
  if value <= 0:
    raise ConversionError(f"--max_shard_size={size!r}: must be positive")
  return value


# --- safetensors, streamed -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TensorSpec:
  """A tensor as a safetensors header describes it: no data."""

  name: str
  shape: Shape
  dtype: np.dtype

  @property
  def nbytes(self) -> int:
    return math.prod(self.shape) * self.dtype.itemsize


def safetensors_header(specs: Sequence[TensorSpec], metadata: Mapping[str, str] | None = None) -> bytes:
  """The 8-byte length and JSON header of a safetensors file holding `specs` back to back, in that order."""
  header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
  offset = 0
  for spec in specs:
    if spec.dtype not in _SAFETENSORS_CODES:
      raise ConversionError(f"tensor {spec.name!r}: dtype {spec.dtype} has no safetensors code")
    header[spec.name] = {"dtype": _SAFETENSORS_CODES[spec.dtype], "shape": list(spec.shape),
                         "data_offsets": [offset, offset + spec.nbytes]}
    offset += spec.nbytes
  raw = json.dumps(header, separators=(",", ":")).encode()
  raw += b" " * (-len(raw) % 8)  # Data starts 8-byte aligned.
  return struct.pack("<Q", len(raw)) + raw


class SafetensorsStreamWriter:
  """Writes one safetensors file tensor by tensor, in the order of the header given up front; checks each one."""

  def __init__(self, path: str, specs: Sequence[TensorSpec], metadata: Mapping[str, str] | None = None):
    self.path = path
    self._specs = list(specs)
    self._next = 0
    header = safetensors_header(self._specs, metadata)
    self._end = len(header) + sum(s.nbytes for s in self._specs)
    try:
      self._file = open(path, "wb")
      self._file.write(header)
    except OSError as e:
      raise ConversionError(f"{path}: cannot write: {e}") from e

  def write(self, name: str, value: np.ndarray) -> None:
    if self._next >= len(self._specs):
      raise ConversionError(f"{self.path}: tensor {name!r} is not in this shard's header")
    spec = self._specs[self._next]
    if (name, tuple(value.shape), value.dtype) != (spec.name, spec.shape, spec.dtype):
      raise ConversionError(
          f"{self.path}: tensor {name!r} {tuple(value.shape)} {value.dtype} does not match header entry"
          f" {spec.name!r} {spec.shape} {spec.dtype}"
      )
    data = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    try:
      self._file.write(data.data)
    except OSError as e:
      raise ConversionError(f"{self.path}: writing tensor {name!r} failed: {e}") from e
    self._next += 1

  def close(self) -> None:
    try:
      written = self._file.tell()
      self._file.close()
    except OSError as e:
      raise ConversionError(f"{self.path}: closing failed: {e}") from e
    if self._next != len(self._specs) or written != self._end:
      raise ConversionError(
          f"{self.path}: wrote {self._next} of {len(self._specs)} tensors ({written} of {self._end} bytes)"
      )

  def abort(self) -> None:
    self._file.close()


# --- the plan: which slice of which leaf becomes which HF tensor ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HfTensor:
  """One HF tensor: `ops` applied to `leaf[index]`."""

  name: str
  shape: Shape
  dtype: np.dtype
  leaf: tuple[str, ...]  # Tree keys of the stored array.
  index: tuple[Any, ...]  # ints (layer, expert) and full slices.
  ops: tuple[Op, ...]
  exact: bool  # Whether `ops` undo the forward ops bit for bit.

  @property
  def spec(self) -> TensorSpec:
    return TensorSpec(self.name, self.shape, self.dtype)

  @property
  def nbytes(self) -> int:
    return self.spec.nbytes


@dataclasses.dataclass(frozen=True)
class ReversePlan:
  items_path: str
  family: Family
  config: ModelConfig
  hf_config: dict[str, Any]
  target_model: str
  scan_layers: bool
  dtype: np.dtype
  tensors: tuple[HfTensor, ...]
  warnings: tuple[str, ...]

  @property
  def total_bytes(self) -> int:
    return sum(t.nbytes for t in self.tensors)

  @property
  def inexact_tensors(self) -> tuple[str, ...]:
    return tuple(t.name for t in self.tensors if not t.exact)


def items_path_of(checkpoint_path: str) -> str:
  """OUT/0/items as given, or found below OUT/0 (a step directory)."""
  path = os.path.abspath(checkpoint_path.rstrip("/"))
  if not os.path.isfile(os.path.join(path, "_METADATA")) and os.path.isfile(os.path.join(path, "items", "_METADATA")):
    return os.path.join(path, "items")
  if not os.path.isdir(path):
    raise ConversionError(f"{path}: no such checkpoint directory (expected OUTPUT_DIR/0/items)")
  return path


def checkpoint_custom_metadata(items_path: str) -> dict[str, Any]:
  """custom_metadata of the step's _CHECKPOINT_METADATA ({} when the file or the entry is absent)."""
  path = os.path.join(os.path.dirname(items_path), "_CHECKPOINT_METADATA")
  try:
    with open(path) as f:
      metadata = json.load(f)
  except FileNotFoundError:
    return {}
  except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ConversionError(f"{path}: unreadable checkpoint metadata ({type(e).__name__}: {e})") from e
  return (metadata.get("custom_metadata") or {}) if isinstance(metadata, dict) else {}


def _hf_config(items_path: str, info: Mapping[str, Any], hf_config_path: str | None) -> tuple[dict[str, Any], str]:
  """The original config.json dict and where it came from."""
  if hf_config_path:
    path = hf_config_path
    if os.path.isdir(path):
      path = os.path.join(path, "config.json")
    try:
      with open(path) as f:
        config = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
      raise ConversionError(f"{path}: cannot read the HF config ({type(e).__name__}: {e})") from e
    source = path
  elif isinstance(info.get("hf_config"), dict):
    config = info["hf_config"]
    source = f"{os.path.dirname(items_path)}/_CHECKPOINT_METADATA (custom_metadata.hf2maxtext.hf_config)"
  else:
    raise ConversionError(
        f"{os.path.dirname(items_path)}/_CHECKPOINT_METADATA records no hf2maxtext.hf_config (a checkpoint written"
        " by MaxText, or by an older converter): pass --hf_config_path=<the original model's config.json>"
    )
  if not isinstance(config, dict):
    raise ConversionError(f"{source}: the HF config is not a JSON object")
  return dict(config), source


def _model_config(config: dict[str, Any], source: str) -> ModelConfig:
  """load_model_config reads a directory; give it one, and report errors against the real source."""
  with tempfile.TemporaryDirectory(prefix="hf2maxtext-config-") as scratch:
    with open(os.path.join(scratch, "config.json"), "w") as f:
      json.dump(config, f)
    try:
      parsed = load_model_config(scratch)
    except ConversionError as e:
      raise ConversionError(str(e).replace(os.path.join(scratch, "config.json"), source)) from e
  return dataclasses.replace(parsed, path=source)


def _slices(param: Param, group: LayerGroup) -> Iterator[tuple[tuple[Any, ...], int, int | None]]:
  """(index into the group's leaf, HF layer, expert) for every HF tensor of `param` in `group`, in storage order.

  A stacked group's leaf has the layer on axis 1 (SCAN_AXIS) after the experts: (X, L, ...) or (d0, L, ...).
  Experts outermost, layers next: consecutive reads stay inside the same chunks.
  """
  assert SCAN_AXIS == 1
  for expert in range(param.experts) if param.experts else [None]:
    lead = (expert,) if expert is not None else ()
    for position, layer in enumerate(group.layers):
      if group.stacked:
        index = (lead or (slice(None),)) + (position,)
      else:
        index = lead
      yield index, param.hf_layer(layer), expert


def _leaf_shape(per_tensor: Shape, param: Param, stacked_layers: int | None) -> Shape:
  """The leaf holding `param`: experts first, then (stacked groups) the layers on SCAN_AXIS."""
  shape = ((param.experts,) if param.experts else ()) + tuple(per_tensor)
  if stacked_layers is not None:
    shape = shape[:SCAN_AXIS] + (stacked_layers,) + shape[SCAN_AXIS:]
  return shape


def _show(keys: Sequence[str]) -> str:
  return "/".join(keys)


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
  custom = checkpoint_custom_metadata(items_path)
  info = custom.get("hf2maxtext") or {}
  hf_config, source = _hf_config(items_path, info, hf_config_path)
  config = _model_config(hf_config, source)
  warnings: list[str] = []
  if family:
    fam = families.family_by_name(family)
    if info.get("family") and info["family"] != family:
      warnings.append(f"--family={family} overrides the checkpoint's recorded family {info['family']!r}")
  elif info.get("family"):
    fam = families.family_by_name(info["family"])
  else:
    fam = families.family_for_architecture(config.architecture, source)
  if config.architecture not in fam.architectures:
    raise ConversionError(
        f"{source}: architecture {config.architecture!r} is not one family {fam.name} converts"
        f" ({', '.join(fam.architectures)})"
    )
  target = families.resolve_target(fam, source, target_model or info.get("target_model"), fam.infer_target(config))
  semantics = fam.semantics(config, target)

  if reader is None:
    from converter.checkpoint_reader import CheckpointReader  # pylint: disable=g-import-not-at-top

    reader = CheckpointReader(items_path)
  params = {k[len(PARAMS):]: a for k, a in reader.arrays.items() if k[: len(PARAMS)] == PARAMS}
  if not params:
    raise ConversionError(f"{items_path}: no arrays under params/params (not a MaxText TrainState checkpoint)")
  decoder = {k[1] for k in params if k[0] == "decoder" and len(k) > 1}
  if "scan_layers" in custom:
    scan_layers = bool(custom["scan_layers"])
  else:
    scan_layers = "layers" in decoder
    warnings.append(f"no scan_layers in the checkpoint metadata; {'scanned' if scan_layers else 'unscanned'}"
                    " layers found in the tree")
  embedding = params.get(("token_embedder", "embedding"))
  if embedding is None:
    raise ConversionError(f"{items_path}: leaf params/params/token_embedder/embedding is missing")
  target_vocab = embedding.shape[0]
  if target_vocab < config.vocab_size:
    raise ConversionError(
        f"{items_path}: token_embedder/embedding has {target_vocab} rows, fewer than {source}'s vocab_size"
        f" {config.vocab_size}"
    )
  layout = fam.layout(config, semantics, target_vocab)

  tensors: list[HfTensor] = []
  used: set[tuple[str, ...]] = set()

  def leaf(keys: tuple[str, ...], expected: Shape) -> StoredArray:
    array = params.get(keys)
    if array is None:
      raise ConversionError(
          f"{items_path}: leaf params/params/{_show(keys)} is missing; {fam.name} ({target}, "
          f"{'scanned' if scan_layers else 'unscanned'}) with {source} needs it"
      )
    if array.shape != expected:
      raise ConversionError(
          f"{items_path}: leaf params/params/{_show(keys)} has shape {array.shape}, but {source} implies"
          f" {expected} ({'scanned' if scan_layers else 'unscanned'})"
      )
    if array.dtype not in _SAFETENSORS_CODES or array.dtype.kind not in "fV":
      raise ConversionError(f"{items_path}: leaf params/params/{_show(keys)} has dtype {array.dtype}, not a float")
    used.add(keys)
    return array

  def add(param: Param, keys: tuple[str, ...], group: LayerGroup | None) -> None:
    try:
      per_tensor = output_shape(param.ops, param.hf_shape)
      ops = inverse_ops(param.ops, param.hf_shape)
    except ValueError as e:
      raise ConversionError(f"{source}: {param.hf}: {e}") from e
    stacked = len(group.layers) if group is not None and group.stacked else None
    array = leaf(keys, _leaf_shape(per_tensor, param, stacked))
    if group is None:
      if param.experts:
        raise ConversionError(f"{fam.name}: top-level parameter {param.maxtext} with experts is not supported")
      slices = [((), None, None)]
    else:
      slices = _slices(param, group)
    for index, layer, expert in slices:
      name = param.hf.format(layer=layer, expert=expert)
      tensors.append(HfTensor(name, tuple(param.hf_shape), array.dtype, PARAMS + keys, index, ops,
                              is_exact(param.ops)))

  for param in layout.top:
    add(param, tuple(param.maxtext.split("/")), None)
  for group in layout.layer_groups(layout.num_layers, scan_layers):
    for param in layout.layer:
      add(param, tuple(group.path) + tuple(param.maxtext.split("/")), group)

  counts = collections.Counter(t.name for t in tensors)
  if len(counts) != len(tensors):
    duplicates = sorted(n for n, c in counts.items() if c > 1)
    raise ConversionError(f"{fam.name}: the layout maps several leaves to HF tensor(s) {', '.join(duplicates[:5])}")
  unused = sorted(_show(k) for k in params if k not in used)
  if unused:
    shown = ", ".join(unused[:5]) + (" ..." if len(unused) > 5 else "")
    raise ConversionError(
        f"{items_path}: {len(unused)} leaf/leaves under params/params that {fam.name} ({target},"
        f" {'scanned' if scan_layers else 'unscanned'}) with {source} does not use: {shown}"
    )
  dtypes = sorted({t.dtype for t in tensors}, key=lambda d: d.itemsize)
  if len(dtypes) > 1:
    warnings.append(f"leaves have mixed dtypes ({', '.join(d.name for d in dtypes)}); each tensor keeps its own")
  if target_vocab > config.vocab_size:
    warnings.append(f"vocabulary padded to {target_vocab} in MaxText: rows {config.vocab_size}.. are dropped")
  inexact = sum(not t.exact for t in tensors)
  if inexact:
    warnings.append(f"{inexact} tensor(s) were transformed in float arithmetic (query scale, norm offset): undone"
                    " to within one unit in the last place, not bit for bit")
  return ReversePlan(items_path, fam, config, hf_config, target, scan_layers, dtypes[-1], tuple(tensors),
                     tuple(warnings))


# --- writing ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ToHuggingFaceResult:
  plan: ReversePlan
  output_dir: str
  files: tuple[str, ...]  # Safetensors files, in order.
  total_bytes: int

  @property
  def num_tensors(self) -> int:
    return len(self.plan.tensors)


def assign_shards(tensors: Sequence[HfTensor], max_shard_size: int) -> list[list[HfTensor]]:
  """Consecutive tensors, a new shard whenever the next would exceed `max_shard_size` (HF's rule: a tensor larger
  than the limit gets a shard of its own)."""
  shards: list[list[HfTensor]] = [[]]
  size = 0
  for tensor in tensors:
    if shards[-1] and size + tensor.nbytes > max_shard_size:
      shards.append([])
      size = 0
    shards[-1].append(tensor)
    size += tensor.nbytes
  return shards


def shard_names(count: int) -> list[str]:
  return [SINGLE_FILE] if count == 1 else [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def written_config(plan: ReversePlan) -> dict[str, Any]:
  """The original config.json with its dtype set to the dtype the tensors are written in."""
  config = dict(plan.hf_config)
  config["dtype"] = plan.dtype.name  # transformers 5 reads `dtype`, transformers 4 `torch_dtype`.
  config["torch_dtype"] = plan.dtype.name
  text = config.get("text_config")
  if isinstance(text, dict):
    config["text_config"] = {**text, **{k: plan.dtype.name for k in ("dtype", "torch_dtype") if k in text}}
  return config


def _write_shards(plan: ReversePlan, reader: CheckpointReader, directory: str, shards: list[list[HfTensor]],
                  read_cache_bytes: int) -> list[str]:
  names = shard_names(len(shards))
  current: OpenArray | None = None
  for file_name, shard in zip(names, shards):
    writer = SafetensorsStreamWriter(os.path.join(directory, file_name), [t.spec for t in shard])
    try:
      for tensor in shard:
        if current is None or current.array.path != tensor.leaf:
          current = None  # Frees the previous leaf's chunk cache first.
          current = reader.open(reader.arrays[tensor.leaf], tensor.index, read_cache_bytes)
        value = current.read(tensor.index)
        for op in tensor.ops:
          value = op(value)
        if value.dtype != tensor.dtype:
          value = value.astype(tensor.dtype)
        writer.write(tensor.name, value)
        del value
    except BaseException:
      writer.abort()
      raise
    writer.close()
  return names


def _prepare_output(output_dir: str, overwrite: bool) -> str:
  """Checks `output_dir` can be (re)placed and returns a fresh staging directory next to it."""
  if os.path.exists(output_dir) and not (os.path.isdir(output_dir) and not os.listdir(output_dir)):
    if not overwrite:
      raise ConversionError(f"{output_dir}: already exists and is not empty; pass --overwrite to replace it")
    if not os.path.isdir(output_dir):
      raise ConversionError(f"{output_dir}: exists and is not a directory")
  parent = os.path.dirname(output_dir)
  try:
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(output_dir)}.hf2maxtext-tmp-", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it 0700; the published directory gets the usual mode.
    return staging
  except OSError as e:
    raise ConversionError(f"{parent}: cannot create a staging directory for the output: {e}") from e


def _publish(staging: str, output_dir: str) -> None:
  """Renames the finished staging directory to `output_dir`, replacing what --overwrite allowed to replace."""
  old = None
  if os.path.exists(output_dir):
    old = staging + ".old"
    os.rename(output_dir, old)
  try:
    os.rename(staging, output_dir)
  except OSError:
    if old:
      os.rename(old, output_dir)
    raise
  if old:
    shutil.rmtree(old, ignore_errors=True)


def convert_to_huggingface(
    checkpoint_path: str,
    output_dir: str,
    *,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
    family: str | None = None,
    overwrite: bool = False,
    hf_config_path: str | None = None,
    target_model: str | None = None,
    read_cache_bytes: int = DEFAULT_READ_CACHE_BYTES,
) -> ToHuggingFaceResult:
  """Writes `checkpoint_path` (OUT/0/items) as an HF checkpoint directory `output_dir`; see the module docstring."""
  limit = parse_size(max_shard_size)
  output_dir = os.path.abspath(output_dir.rstrip("/"))
  from converter.checkpoint_reader import CheckpointReader  # pylint: disable=g-import-not-at-top

  items_path = items_path_of(checkpoint_path)
  reader = CheckpointReader(items_path)
  plan = plan_to_huggingface(items_path, family=family, hf_config_path=hf_config_path, target_model=target_model,
                             reader=reader)
  for warning in plan.warnings:
    logging.warning("%s", warning)
  staging = _prepare_output(output_dir, overwrite)
  try:
    shards = assign_shards(plan.tensors, limit)
    names = _write_shards(plan, reader, staging, shards, read_cache_bytes)
    if len(names) > 1:
      weight_map = {t.name: name for name, shard in zip(names, shards) for t in shard}
      index = {
          "metadata": {"total_parameters": sum(math.prod(t.shape) for t in plan.tensors),
                       "total_size": plan.total_bytes},
          "weight_map": dict(sorted(weight_map.items())),
      }
      with open(os.path.join(staging, INDEX_FILE), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    with open(os.path.join(staging, "config.json"), "w") as f:
      json.dump(written_config(plan), f, indent=2, sort_keys=True)
      f.write("\n")
    _publish(staging, output_dir)
  except OSError as e:
    shutil.rmtree(staging, ignore_errors=True)
    raise ConversionError(f"{output_dir}: writing the HF checkpoint failed: {e}") from e
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  return ToHuggingFaceResult(plan, output_dir, tuple(names), plan.total_bytes)
