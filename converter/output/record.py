"""The conversion record: what a conversion writes into the step's _CHECKPOINT_METADATA (Orbax's custom_metadata)
and what the reverse direction, the validator and a resumed run read back from it: one writer, one reader.

  {"scan_layers": bool, "hf2maxtext": {"family", "target_model", "hf_architecture", "save_dtype", "quant_method",
   "fp8", "maxtext_overrides", "hf_config", "hf_source", "chunking", "logical_axes", "lora_adapter"}}

`scan_layers` sits at the top level because MaxText's own trainer records it there too; a checkpoint MaxText wrote
has it and no `hf2maxtext` entry.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from converter import storage
from converter.errors import ConversionError
from converter.output import layout
from converter.serving_files import Original
from converter.sources.lora import LoraMergedSource
from converter.sources.maxtext import MaxTextSource

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
  # Where the original model was read (converter/serving_files.py `Original.record`): the way back copies its
  # tokenizer, chat template and generation config from there.
  hf_source: dict[str, Any] | None = None
  chunking: dict[str, Any] | None = None  # The rule the stored chunks were cut by (converter/layout/chunking.py).
  logical_axes: dict[str, list[str | None] | None] | None = None  # Every leaf's MaxText logical axes (None: none).
  # --lora_adapter_path: the adapter merged in (path, sha256 of its safetensors, r, alpha, rslora, patterns, and
  # every module with its rank, alpha, scale and the base tensor it went into); a MaxText LoRA checkpoint merged
  # into a MaxText base (--checkpoint_path with --lora_checkpoint_path): its path, r, alpha and modules.
  lora_adapter: dict[str, Any] | None = None

  @classmethod
  def of_plan(cls, plan: Any, overrides: dict[str, Any]) -> ConversionRecord:
    """The record of a conversion of `plan` (converter/planning/plan.py) with MaxText `overrides`. A
    MaxText checkpoint laid out again (converter/planning/relayout.py) keeps what its own record says of the
    original (config, where it was read, its format, a merged adapter), unless --hf_config_path named a config.json."""
    source = plan.source
    origin = source.record if isinstance(source, MaxTextSource) else None
    if origin is not None and not storage.is_file(plan.config.path):
      hf_config, hf_source = origin.hf_config, origin.hf_source
    else:
      hf_config = json.loads(storage.read_text(plan.config.path))
      hf_source = Original.of_directory(storage.parent(plan.config.path)).record()
    if isinstance(source, LoraMergedSource):
      lora_adapter = source.adapter.record(source.merged)
    else:
      lora_adapter = (source.lora or origin.lora_adapter) if origin is not None else None
    return cls(
        scan_layers=plan.scan_layers,
        family=plan.family.name,
        target_model=plan.target_model,
        hf_architecture=plan.config.architecture,
        save_dtype=plan.save_dtype.name,
        quant_method=origin.quant_method if origin is not None else source.quant_method,
        fp8=dataclasses.asdict(plan.fp8) if plan.fp8 else None,
        maxtext_overrides=overrides,
        hf_config=hf_config,
        hf_source=hf_source,
        chunking=plan.chunking.record(),
        logical_axes={leaf.name: None if leaf.logical_axes is None else list(leaf.logical_axes)
                      for leaf in plan.leaves},
        lora_adapter=lora_adapter,
    )

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
    known = {f.name for f in dataclasses.fields(cls)} - {"scan_layers"}
    scan_layers = custom.get("scan_layers")
    return cls(scan_layers=None if scan_layers is None else bool(scan_layers),
               **{k: v for k, v in entry.items() if k in known})


def step_custom_metadata(items_path: str) -> dict[str, Any]:
  """custom_metadata of the step's _CHECKPOINT_METADATA ({} when the file or the entry is absent)."""
  path = layout.metadata_path(items_path)
  if not storage.exists(path):
    return {}
  try:
    metadata = json.loads(storage.read_text(path))
  except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ConversionError(f"{path}: unreadable checkpoint metadata ({type(e).__name__}: {e})") from e
  custom = metadata.get("custom_metadata") if isinstance(metadata, dict) else None
  return custom if isinstance(custom, dict) else {}
