"""The options of a conversion, grouped by the concern that reads them (as Orbax groups its own on one context).

`main.py` parses each flag once into one of these; the layer that acts on an option is the only other place that
names it. A library caller builds the same objects.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING

from converter.layout.chunking import ChunkRule
from handlers.shares import Processes
from handlers.write_options import DEFAULT_MAX_INFLIGHT_BYTES

if TYPE_CHECKING:
  from converter.progress import Progress
  from handlers.early_reads import EarlyReads


@dataclasses.dataclass(frozen=True)
class PlanOptions:
  """What the checkpoint becomes: read by the plan (converter/planning/plan.py) and the family resolution."""

  scan_layers: bool = True
  save_dtype: str = "bfloat16"
  target_model: str | None = None  # Default: inferred from config.json.
  target_vocab_size: int | None = None  # Zero-pad the vocabulary to this size.
  allow_unused_tensors: bool = False
  keep_fp8: bool = False  # FP8 kernels kept beside their block scales (MaxText's fp8 models).
  text_only: bool = False  # A multimodal checkpoint's text decoder alone, its towers skipped.
  lora_adapter_path: str | None = None  # A PEFT LoRA adapter directory merged into the weights (sources/lora.py).
  chunking: ChunkRule = ChunkRule()  # Where stored chunks are cut, for the mesh that restores them.


@dataclasses.dataclass(frozen=True)
class SaveOptions:
  """How the plan is written to Orbax: read by the Orbax writer (converter/output/orbax_writer.py)."""

  lazy: bool = True  # Each block read when Orbax writes it; False materialises every leaf first.
  devices: int = 1  # Leaves are sharded over this many (simulated) devices when > 1.
  max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES
  compression: bool = True  # zstd (Orbax's default), else stored uncompressed.
  zstd_level: int | None = None  # handlers.WriteOptions.zstd_level; None: the plan's (`Plan.zstd_level`).
  checksums: bool = True  # A checksum on every stored chunk, verified by every restore.


@dataclasses.dataclass(frozen=True)
class ReverseOptions:
  """MaxText -> HuggingFace: what the HF checkpoint looks like and how much is read ahead."""

  max_shard_size: int | str = "5GB"
  family: str | None = None  # Default: recorded in the checkpoint.
  hf_config_path: str | None = None  # For checkpoints that do not record their config.json.
  target_model: str | None = None
  read_cache_bytes: int = 1 << 30
  read_ahead_bytes: int = 128 << 20
  lora_alpha: float | None = None  # --export=lora_adapter: for checkpoints whose metadata records no lora_alpha.
  # A MaxText LoRA checkpoint (its qwix factors) merged into the base on the way back: one full HF model.
  lora_checkpoint_path: str | None = None
  hub_private: bool = False  # An hf:// output repo that does not exist is created private.


@dataclasses.dataclass(frozen=True)
class RunContext:
  """The run around a conversion, in either direction: read by the output (converter/output/)."""

  processes: Processes = Processes()
  overwrite: bool = False  # Replace a finished output.
  resume: bool = False  # Continue an interrupted conversion from what it wrote durably.
  progress: Progress | None = None  # Told the total, then every block written.
  cancel: threading.Event | None = None  # Set to stop before the next block; nothing is committed.
  # A one-process lazy save's first blocks, read while JAX and Orbax loaded (conversion.read_early); closed by
  # the save, which reads the blocks itself when it resumes an interrupted run.
  early_reads: EarlyReads | None = None
