"""PEFT LoRA adapters, merged into the base checkpoint's weights as they are read.

A PEFT adapter directory holds `adapter_config.json` and `adapter_model.safetensors`, whose tensors are named
`base_model.model.<module>.lora_A.weight` (r, in) and `.lora_B.weight` (out, r) for each adapted linear module of
the model. Merged, the module's weight `<module>.weight` becomes `W + s * (B @ A)` with `s = lora_alpha / r`
(`lora_alpha / sqrt(r)` with `use_rslora`), r and alpha per module from `rank_pattern` / `alpha_pattern`.

`merged_source` wraps any source (plain or quantized) so that each adapted weight reads as that sum: computed in
float32 from the base's float32 values (a quantized weight dequantized first), rounded once to the dtype asked
for, before anything a family does to the tensor (transposes, head reshapes, RoPE permutations, query scaling), so
a merged weight takes exactly the path an unmerged one takes. A region of the weight reads only what it needs:
rows of W take the same rows of B and all of A (r rows: small), columns of W the same columns of A.

Everything an adapter may hold that a merge of `B @ A` into the weights cannot reproduce is refused while the
adapter is read, naming the file, the module and the reason (docs/lora.md): DoRA, `modules_to_save`, trained
biases, `fan_in_fan_out` weights, embedding LoRA, parameter (not module) targets, activated LoRA. The adapter is
read with this project's safetensors reader; torch and peft are never imported.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from typing import Any, Callable, Mapping

import numpy as np

from converter import json_input, storage
from converter.arrays import copy_into, placed_shape
from converter.checkpoint_format.record import SourceFacts
from converter.errors import ConversionError
from converter.sources.base import FLOATING, Region, SourceTensor, TensorSource, as_slices, squeeze_ints
from converter.sources.safetensors import TensorInfo, read_header

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
LORA_A, LORA_B = ".lora_A.weight", ".lora_B.weight"
_HASH_CHUNK = 64 << 20
# Values merged per slab in `LoraMergedTensor.read`: 1 MiB of float32.
SLAB_VALUES = 1 << 18

# adapter_config.json settings under which `W + s * B @ A` is not what PEFT computes: (key, is it set, why).
_REFUSED_SETTINGS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("use_dora", bool, "DoRA (weight-decomposed LoRA) rescales every output row of the merged weight by a learned"
     " magnitude (lora_magnitude_vector); W + s * B @ A alone would be wrong"),
    ("modules_to_save", bool, "modules_to_save replaces whole modules (e.g. lm_head, embed_tokens) by trained copies"
     " that are not LoRA factors; merge them into the base checkpoint first (peft merge_and_unload)"),
    ("bias", lambda v: v not in (None, "none"), "the adapter trains the base modules' biases (bias != \"none\")"),
    ("lora_bias", bool, "lora_B carries a bias of its own (lora_bias: true)"),
    ("fan_in_fan_out", bool, "fan_in_fan_out: the base weights are stored (in, out) (GPT-2's Conv1D), not the"
     " (out, in) linear weights this merge adds B @ A to"),
    ("target_parameters", bool, "target_parameters adapts raw parameter tensors (fused MoE experts), not linear"
     " modules"),
    ("trainable_token_indices", bool, "trainable_token_indices trains embedding rows, which are not LoRA factors"),
    ("alora_invocation_tokens", bool, "activated LoRA applies only after its invocation tokens; a merged weight"
     " would apply it everywhere"),
    ("layer_replication", bool, "layer_replication changes the model's layer structure"),
    ("use_qalora", bool, "QA-LoRA pools the inputs of lora_A; its factors do not merge as B @ A"),
    ("arrow_config", bool, "Arrow routes between several adapters per token"),
    # The other LoRA variants of peft 0.21.2 (LoraConfig fields marked is_lora_variant; init_lora_weights="mica"):
    # each computes its own delta, not s * B @ A.
    ("velora_config", bool, "VeLoRA is a LoRA variant whose forward is not W + s * B @ A"),
    ("monteclora_config", bool, "MonteCLoRA is a LoRA variant whose forward is not W + s * B @ A"),
    ("use_bdlora", bool, "BD-LoRA is a LoRA variant whose forward is not W + s * B @ A"),
    ("kasa_config", bool, "KaSA is a LoRA variant whose forward is not W + s * B @ A"),
    ("init_lora_weights", lambda v: v == "mica", "MiCA is a LoRA variant whose forward is not W + s * B @ A"),
)


def get_pattern_key(pattern_keys: Any, key_to_match: str) -> str:
  """peft 0.21.2's `peft.utils.other.get_pattern_key`: the first pattern key that matches the end of the module
  key at a `.` boundary (`re.match(rf"(.*\\.)?({key})$", key_to_match)`, the key a regex), else the module key."""
  for key in pattern_keys:
    if re.match(rf"(.*\.)?({key})$", key_to_match):
      return key
  return key_to_match


@dataclasses.dataclass(frozen=True)
class LoraModule:
  """One adapted linear module: its factors and merge scale."""

  module: str  # The HF module path, e.g. model.layers.0.self_attn.q_proj.
  a: TensorInfo  # (r, in)
  b: TensorInfo  # (out, r)
  rank: int
  alpha: float
  scale: float

  @property
  def weight_name(self) -> str:
    return self.module + ".weight"


@dataclasses.dataclass(frozen=True)
class LoraAdapter:
  """A PEFT LoRA adapter directory, checked: every module it adapts, with its rank, alpha and scale."""

  location: str
  weights_path: str
  sha256: str
  rank: int
  alpha: float
  use_rslora: bool
  rank_pattern: Mapping[str, int]
  alpha_pattern: Mapping[str, float]
  modules: tuple[LoraModule, ...]

  def record(self, merged: Mapping[str, str]) -> dict[str, Any]:
    """What the conversion record keeps of the adapter; `merged` maps each module to the base tensor it was
    merged into."""
    return {"path": self.location, "file": ADAPTER_WEIGHTS, "sha256": self.sha256, "r": self.rank,
            "lora_alpha": self.alpha, "use_rslora": self.use_rslora, "rank_pattern": dict(self.rank_pattern),
            "alpha_pattern": dict(self.alpha_pattern),
            "modules": {m.module: {"r": m.rank, "lora_alpha": m.alpha, "scale": m.scale,
                                   "base_tensor": merged[m.module]} for m in self.modules}}


def _read_config(directory: str) -> tuple[dict[str, Any], str]:
  path = storage.join(directory, ADAPTER_CONFIG)
  if not storage.is_file(path):
    raise ConversionError(f"{directory}: no {ADAPTER_CONFIG}: a PEFT LoRA adapter directory holds {ADAPTER_CONFIG}"
                          f" and {ADAPTER_WEIGHTS}")
  return json_input.read_object(path, "unreadable adapter config"), path


def _positive(value: Any, what: str, path: str, integer: bool = False) -> float:
  valid = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
  if not valid or (integer and int(value) != value):
    raise ConversionError(f"{path}: {what} is {value!r}; expected a positive {'integer' if integer else 'number'}")
  return int(value) if integer else float(value)


def _file_sha256(path: str) -> str:
  digest = hashlib.sha256()
  total = storage.size(path)
  for start in range(0, total, _HASH_CHUNK):
    digest.update(storage.read_bytes(path, start, min(total, start + _HASH_CHUNK)))
  return digest.hexdigest()


def _refuse_tensor(path: str, name: str) -> ConversionError:
  """Why a tensor that is not a lora_A / lora_B weight cannot be merged."""
  module = name[len(PREFIX):] if name.startswith(PREFIX) else name
  if ".lora_magnitude_vector" in name:
    why = "a DoRA magnitude vector: DoRA rescales the merged weight, which W + s * B @ A does not"
  elif ".lora_embedding_A" in name or ".lora_embedding_B" in name:
    why = "embedding-layer LoRA (lora_embedding_A/B) is not supported"
  elif ".lora_A." in name or ".lora_B." in name:
    why = "a lora_A/lora_B tensor other than `.weight` (a lora bias, or an adapter saved under its adapter name)"
  elif name.endswith(".base_layer.weight"):
    why = ("a full copy of the base module's weight, which peft saves when an embedding layer or lm_head is"
           " targeted (save_embedding_layers): it replaces the base weight (a resized vocabulary), which is not"
           " supported")
  elif not name.startswith(PREFIX):
    why = f"not under {PREFIX!r}, as PEFT names a LoRA adapter's tensors"
  else:
    why = "not a LoRA factor: a full module weight (modules_to_save) or a trained bias"
  return ConversionError(f"{path}: tensor {name!r} (module {module.rsplit('.', 1)[0]!r}): {why}")


def read_adapter(directory: str) -> LoraAdapter:
  """The adapter in `directory` (local, bucket, or a resolved Hub snapshot), checked against everything a merge
  cannot reproduce; reads the config and the safetensors header (and hashes the file), never the factors."""
  config, config_path = _read_config(directory)
  peft_type = config.get("peft_type")
  if peft_type != "LORA":
    raise ConversionError(f"{config_path}: peft_type is {peft_type!r}; only LoRA adapters (\"LORA\") can be merged")
  for key, is_set, why in _REFUSED_SETTINGS:
    if is_set(config.get(key)):
      raise ConversionError(f"{config_path}: {key} = {config[key]!r} cannot be merged: {why}")
  rank = _positive(config.get("r"), "r", config_path, integer=True)
  alpha = _positive(config.get("lora_alpha"), "lora_alpha", config_path)
  use_rslora = bool(config.get("use_rslora", False))
  rank_pattern = dict(config.get("rank_pattern") or {})
  alpha_pattern = dict(config.get("alpha_pattern") or {})
  for key, value in rank_pattern.items():
    _positive(value, f"rank_pattern[{key!r}]", config_path, integer=True)
  for key, value in alpha_pattern.items():
    _positive(value, f"alpha_pattern[{key!r}]", config_path)

  weights_path = storage.join(directory, ADAPTER_WEIGHTS)
  if not storage.is_file(weights_path):
    other = " (adapter_model.bin, a pickle, is not read: save the adapter with safe_serialization)" if storage.is_file(
        storage.join(directory, "adapter_model.bin")) else ""
    raise ConversionError(f"{directory}: no {ADAPTER_WEIGHTS}{other}")
  factors: dict[str, dict[str, TensorInfo]] = {}
  for name, info in read_header(weights_path).items():
    side = "a" if name.endswith(LORA_A) else "b" if name.endswith(LORA_B) else None
    if side is None or not name.startswith(PREFIX):
      raise _refuse_tensor(weights_path, name)
    if info.format not in ("F32", "F16", "BF16", "F64"):
      raise ConversionError(f"{weights_path}: tensor {name!r} has dtype {info.format}; LoRA factors must be floats")
    module = name[len(PREFIX): -len(LORA_A)]
    factors.setdefault(module, {})[side] = info
  if not factors:
    raise ConversionError(f"{weights_path}: no LoRA factors (no *{LORA_A} / *{LORA_B} tensors)")

  modules = []
  for module, pair in sorted(factors.items()):
    missing = [f"lora_{s.upper()}" for s in "ab" if s not in pair]
    if missing:
      raise ConversionError(f"{weights_path}: module {module!r} has no {missing[0]} weight; every adapted module needs"
                            " lora_A and lora_B")
    a, b = pair["a"], pair["b"]
    module_rank = rank_pattern.get(get_pattern_key(rank_pattern, module), rank)
    module_alpha = float(alpha_pattern.get(get_pattern_key(alpha_pattern, module), alpha))
    if len(a.shape) != 2 or len(b.shape) != 2 or a.shape[0] != b.shape[1]:
      raise ConversionError(f"{weights_path}: module {module!r}: lora_A {a.shape} and lora_B {b.shape} do not fit"
                            " each other (lora_A (r, in), lora_B (out, r))")
    if a.shape[0] != module_rank:
      raise ConversionError(f"{weights_path}: module {module!r}: lora_A has {a.shape[0]} rows, but {config_path}"
                            f" gives the module r = {module_rank} (r, or its rank_pattern entry)")
    scale = module_alpha / (math.sqrt(module_rank) if use_rslora else module_rank)
    modules.append(LoraModule(module, a, b, int(module_rank), module_alpha, scale))
  return LoraAdapter(directory, weights_path, _file_sha256(weights_path), int(rank), alpha, use_rslora,
                     rank_pattern, alpha_pattern, tuple(modules))


@dataclasses.dataclass(frozen=True)
class LoraMergedTensor:
  """A base weight (out, in) with its module's `s * B @ A` added, presented as one float32 tensor."""

  base: SourceTensor
  lora: LoraModule

  @property
  def name(self) -> str:
    return self.base.name

  @property
  def shape(self) -> tuple[int, ...]:
    return tuple(self.base.shape)

  @property
  def dtype(self) -> np.dtype:
    return np.dtype(np.float32)

  @property
  def format(self) -> str:
    return f"{self.base.format} + LoRA r{self.lora.rank}"

  @property
  def files(self) -> tuple[str, ...]:
    return tuple(dict.fromkeys((*self.base.files, self.lora.a.path)))

  @property
  def stored_names(self) -> tuple[str, ...]:
    return (*self.base.stored_names, self.lora.a.name, self.lora.b.name)

  @property
  def byte_ranges(self) -> tuple[tuple[str, int, int], ...]:
    return self.base.byte_ranges + self.lora.a.byte_ranges + self.lora.b.byte_ranges

  def read(self, dtype: np.dtype | None = None, region: Region = (), transpose: bool = False) -> np.ndarray:
    """`float32(W) + (B @ A) * s` over the region, in float32, rounded once to `dtype`: a slab of about
    `SLAB_VALUES` values at a time, placed (transposed, when asked) into the output, so that the float32
    temporaries stay small beside it whatever the region (whole-region ones were eight times a block)."""
    rows, cols = as_slices(self.shape, region) + tuple(slice(0, d) for d in self.shape[len(region):])
    a = self.lora.a.read(np.float32, (slice(None), cols))
    width = cols.stop - cols.start
    out = np.empty(placed_shape((rows.stop - rows.start, width), transpose),
                   dtype=self.dtype if dtype is None else dtype)
    step = max(1, SLAB_VALUES // max(1, width))
    for start in range(rows.start, rows.stop, step):
      slab = slice(start, min(start + step, rows.stop))
      merged = self.base.read(np.float32, (slab, cols))
      add_update(merged, self.lora.b.read(np.float32, (slab,)), a, self.lora.scale)
      placed = slice(slab.start - rows.start, slab.stop - rows.start)
      copy_into(out[:, placed] if transpose else out[placed], merged, transpose)
    return squeeze_ints(out, region)


def add_update(weight: np.ndarray, b: np.ndarray, a: np.ndarray, scale: float) -> None:
  """`weight += (B @ A) * scale` in float32, in place: PEFT's get_delta_weight, summed as `_product` sums."""
  delta = _product(b, a)
  weight += np.multiply(delta, np.float32(scale), out=delta)


def _product(b: np.ndarray, a: np.ndarray) -> np.ndarray:
  """B @ A in float32, each element summed over the rank in the same order whatever the region: a BLAS product
  sums in an order that depends on the operands' shapes, so a region would differ from the same rows read whole
  in the last bit (and --verify, which re-reads in other blocks, would report it)."""
  total = np.multiply.outer(b[:, 0], a[0])
  term = np.empty_like(total)
  for k in range(1, a.shape[0]):
    total += np.multiply.outer(b[:, k], a[k], out=term)
  return total


@dataclasses.dataclass(frozen=True)
class LoraMergedSource:
  """A source whose adapted weights read merged; `merged` maps each adapter module to the stored tensor name it
  was merged into."""

  location: str
  tensors: Mapping[str, SourceTensor]
  files: tuple[str, ...]
  quant_method: str | None
  adapter: LoraAdapter
  merged: Mapping[str, str]
  read_cache_bytes = 0

  @property
  def facts(self) -> SourceFacts:
    return SourceFacts(quant_method=self.quant_method, lora_adapter=self.adapter.record(self.merged))


def merged_source(source: TensorSource, adapter: LoraAdapter,
                  rename: Callable[[str], str] = lambda name: name) -> LoraMergedSource:
  """`source` with every module of `adapter` merged into its weight.

  `rename` maps a tensor name to the name the model's layout reads it as (the family's aliases: a multimodal
  checkpoint may store `model.language_model.layers...` where the adapter names transformers' in-memory module):
  an adapter module matches the stored tensor that shares its weight's renamed name.
  """
  by_layout = {rename(name): name for name in source.tensors}
  tensors = dict(source.tensors)
  merged: dict[str, str] = {}
  for lora in adapter.modules:
    stored = lora.weight_name if lora.weight_name in source.tensors else by_layout.get(rename(lora.weight_name))
    if stored is None:
      raise ConversionError(f"{adapter.weights_path}: module {lora.module!r} has no base weight: {source.location}"
                            f" stores no {lora.weight_name!r} (nor another name of it); the adapter was trained on"
                            " another model")
    base = source.tensors[stored]
    expected = (lora.b.shape[0], lora.a.shape[1])
    if base.dtype not in FLOATING or tuple(base.shape) != expected:
      what = f"has shape {tuple(base.shape)}" if tuple(base.shape) != expected else f"is {base.format}"
      raise ConversionError(f"{adapter.weights_path}: module {lora.module!r}: lora_B {lora.b.shape} @ lora_A"
                            f" {lora.a.shape} is {expected}, but the base weight {stored!r} {what}"
                            f" (in {', '.join(base.files)})")
    tensors[stored] = LoraMergedTensor(base, lora)
    merged[lora.module] = stored
  files = tuple(dict.fromkeys((*source.files, adapter.weights_path)))
  return LoraMergedSource(source.location, tensors, files, source.quant_method, adapter, merged)
