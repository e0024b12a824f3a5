"""The conversion record: what a conversion writes into the step's _CHECKPOINT_METADATA (Orbax's custom_metadata)
and what the reverse direction, the validator and a resumed run read back from it: one writer, one reader.

  {"scan_layers": bool, "hf2maxtext": {"family", "target_model", "hf_architecture", "save_dtype", "quant_method",
   "fp8", "maxtext_overrides", "hf_config", "hf_source", "chunking", "logical_axes", "lora_adapter"}}

`scan_layers` sits at the top level because MaxText's own trainer records it there too; a checkpoint MaxText wrote
has it and no `hf2maxtext` entry.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from converter import json_input, storage
from converter.checkpoint_format import layout
from converter.checkpoint_format.original import Original
from converter.errors import ConversionError

KEY = "hf2maxtext"
PARAMS = ("params", "params")  # Where the checkpoint's tree keeps the leaves the record names.


def leaf_name(keys: tuple[str, ...]) -> str:
  """The name the record gives the leaf at tree keys `keys`: its path below `params/params`, joined by "/" (a leaf
  elsewhere keeps its whole path, and so matches none the record names)."""
  return "/".join(keys[len(PARAMS):] if keys[: len(PARAMS)] == PARAMS else keys)


@dataclasses.dataclass(frozen=True)
class ConversionRecord:
  """Every field is None (or empty) when the checkpoint does not record it (MaxText's own, an older converter's)."""

  scan_layers: bool | None = None
  family: str | None = None
  target_model: str | None = None
  hf_architecture: str | None = None
  save_dtype: str | None = None
  quant_method: str | None = None  # How the source stored its weights (None: plain floats).
  fp8: dict[str, Any] | None = None  # --keep_fp8: the FP8 kernels were kept beside their scales.
  maxtext_overrides: dict[str, Any] | None = None
  hf_config: Any = None  # The original config.json, verbatim: --direction=to_huggingface writes it back.
  # Where the original model was read (converter/checkpoint_format/original.py): the way back copies its
  # tokenizer, chat template and generation config from there.
  hf_source: dict[str, Any] | None = None
  chunking: dict[str, Any] | None = None  # The rule the stored chunks were cut by (converter/layout/chunking.py).
  logical_axes: dict[str, list[str | None] | None] | None = None  # Every leaf's MaxText logical axes (None: none).
  # --lora_adapter_path: the adapter merged in (path, sha256 of its safetensors, r, alpha, rslora, patterns, and
  # every module with its rank, alpha, scale and the base tensor it went into); a MaxText LoRA checkpoint merged
  # into a MaxText base (--checkpoint_path with --lora_checkpoint_path): its path, r, alpha and modules.
  lora_adapter: dict[str, Any] | None = None

  def custom_metadata(self) -> dict[str, Any]:
    """What Orbax writes as the step's custom_metadata."""
    entry = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "scan_layers"}
    return {"scan_layers": self.scan_layers, KEY: entry}

  @classmethod
  def read(cls, items_path: str) -> ConversionRecord:
    """The record of the checkpoint at `items_path` (OUT/0/items); empty fields where it records nothing."""
    custom = step_custom_metadata(items_path)
    entry = custom.get(KEY)
    entry = entry if isinstance(entry, dict) else {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {k: v for k, v in entry.items() if k in fields and k != "scan_layers"}
    values["scan_layers"] = custom.get("scan_layers")
    for name, value in values.items():
      expected = _json_type(fields[name].type)
      if value is not None and expected is not None and not isinstance(value, expected):
        where = name if name == "scan_layers" else f"{KEY}.{name}"
        raise ConversionError(f"{layout.metadata_path(items_path)}: custom_metadata.{where} is"
                              f" {json_input.type_name(value)}, where a conversion records {expected.__name__}")
    return cls(**values)


def _json_type(annotation: str) -> type | None:
  """The JSON type a record field of type `annotation` holds (besides null); None where it may hold anything."""
  return next((t for t in (str, dict, bool) if str(annotation).startswith(t.__name__)), None)


@dataclasses.dataclass(frozen=True)
class SourceFacts:
  """What a conversion records of the source it read, as every source states it (`TensorSource.facts`)."""

  quant_method: str | None = None  # How the source stored its weights (None: plain floats).
  lora_adapter: dict[str, Any] | None = None  # An adapter merged in while reading (ConversionRecord.lora_adapter).
  original: ConversionRecord | None = None  # A MaxText checkpoint laid out again: its own record of its original.


def recorded_field(items_path: str, name: str) -> str:
  """Where the record of the checkpoint at `items_path` keeps its field `name`, as an error names it."""
  return f"{layout.metadata_path(items_path)} (custom_metadata.{KEY}.{name})"


def step_custom_metadata(items_path: str) -> dict[str, Any]:
  """custom_metadata of the step's _CHECKPOINT_METADATA ({} when the file or the entry is absent)."""
  path = layout.metadata_path(items_path)
  if not storage.exists(path):
    return {}
  metadata = json_input.read(path, "unreadable checkpoint metadata")
  custom = metadata.get("custom_metadata") if isinstance(metadata, dict) else None
  return custom if isinstance(custom, dict) else {}


def original_config(items_path: str, record: ConversionRecord, hf_config_path: str | None
                    ) -> tuple[dict[str, Any], str]:
  """The original config.json of the checkpoint at `items_path` and where it came from: --hf_config_path's (a
  config file, or the directory holding config.json) when given, else the one its record keeps."""
  if hf_config_path:
    path, _ = _config_file_and_directory(hf_config_path)
    try:
      config = json_input.read(path, "cannot read the HF config")
    except FileNotFoundError as e:
      raise ConversionError(f"{path}: cannot read the HF config (no such file)") from e
    source = path
  elif isinstance(record.hf_config, dict):
    config = record.hf_config
    source = f"{layout.metadata_path(items_path)} (custom_metadata.{KEY}.hf_config)"
  else:
    raise ConversionError(
        f"{layout.metadata_path(items_path)} records no {KEY}.hf_config (a checkpoint written by MaxText, or by an"
        " older converter): pass --hf_config_path=<the original model's config.json>"
    )
  if not isinstance(config, dict):
    raise ConversionError(f"{source}: the HF config is not a JSON object")
  return dict(config), source


def original_model(record: ConversionRecord, hf_config_path: str | None) -> Original | None:
  """Where the original model lives: --hf_config_path's when given (as `original_config` reads it), else the
  recorded one."""
  if hf_config_path:
    return Original.of_directory(_config_file_and_directory(hf_config_path)[1])
  return Original.of_record(record.hf_source)


def _config_file_and_directory(hf_config_path: str) -> tuple[str, str]:
  """--hf_config_path names a config file, or the directory holding config.json: both, from either."""
  if hf_config_path.endswith(".json"):
    return hf_config_path, storage.parent(hf_config_path)
  return storage.join(hf_config_path, "config.json"), hf_config_path
