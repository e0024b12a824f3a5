"""`--inspect`: what a MaxText checkpoint holds, before converting it, from its metadata alone: a run directory's
steps, the step's leaves (path, shape, dtype, stored chunk and block, codecs: element order, compression,
checksum), its layout (Orbax's storage format, scanned or not, the chunking rule) and the conversion record
(family, original model, overrides)."""

from __future__ import annotations

import datetime
import json
from typing import Any

from converter import storage
from converter.checkpoint_format import layout, steps
from converter.checkpoint_format.record import ConversionRecord, leaf_name
from converter.checkpoint_format.original import Original
from converter.errors import ConversionError


def _codecs(reader, array) -> str:
  """The chunk codecs as a restore meets them: the element order where it is not C's, compression, checksum (e.g.
  `transpose(1, 0)+zstd(1)+checksum`)."""
  shown = []
  for codec in reader.chunk_codecs(array):
    name, configuration = codec["name"], codec.get("configuration", {})
    if name == "zstd":
      shown.append(f"zstd({configuration.get('level')})" + ("+checksum" if configuration.get("checksum") else ""))
    elif name == "transpose":  # Elements stored in another order than C's (--chunk_element_order=huggingface).
      shown.append(f"transpose{tuple(configuration.get('order', ()))}")
    elif name != "bytes":
      shown.append(name)
  return "+".join(shown) or "none"


def _committed_at(items_path: str) -> str:
  try:
    metadata = json.loads(storage.read_text(layout.metadata_path(items_path)))
    nanoseconds = metadata.get("commit_timestamp_nsecs") if isinstance(metadata, dict) else None
  except (OSError, ValueError, UnicodeDecodeError):
    return "unknown"
  if not isinstance(nanoseconds, int):
    return "not recorded"
  return datetime.datetime.fromtimestamp(nanoseconds / 1e9, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _record_lines(record: ConversionRecord) -> list[str]:
  if record.family is None:
    return ["record:            none of hf2maxtext's (a checkpoint MaxText wrote, or an older converter's): the way"
            " back needs --hf_config_path=<the original model's directory>"]
  original = Original.of_record(record.hf_source)
  config: Any = record.hf_config if isinstance(record.hf_config, dict) else {}
  overrides = " ".join(f"{k}={json.dumps(v, separators=(',', ':'))}"
                       for k, v in (record.maxtext_overrides or {}).items())
  lines = [f"family:            {record.family} ({record.hf_architecture}), target model {record.target_model},"
           f" saved as {record.save_dtype}",
           f"original:          {original.describe() if original else 'not recorded'}"
           f" (model_type {config.get('model_type')}, {config.get('num_hidden_layers')} layers)",
           f"quantized source:  {record.quant_method or 'no'}" + (f", fp8 kept: {record.fp8}" if record.fp8 else ""),
           f"MaxText overrides: {overrides or 'none recorded'}"]
  if record.lora_adapter:
    lora = record.lora_adapter
    lines.append(f"lora merged:       {lora.get('path') or lora.get('lora_checkpoint_path')} (r {lora.get('r')},"
                 f" lora_alpha {lora.get('lora_alpha')})")
  lines.append("hf2maxtext version: not recorded (no record carries one)")
  return lines


def describe_checkpoint(checkpoint_path: str, step: str = steps.LATEST, step_given: bool = False) -> str:
  """The text `--inspect` prints for `checkpoint_path` (an items, step or run directory; --step in a run's)."""
  from converter.sources import orbax_format  # pylint: disable=g-import-not-at-top
  from converter.sources.checkpoint_reader import CheckpointReader  # pylint: disable=g-import-not-at-top

  path = storage.resolve(checkpoint_path)
  lines = []
  run = [] if steps.is_checkpoint(path) else steps.run_steps(path)
  if run:
    lines.append(f"run directory:     {storage.parent(run[0].path)}: {len(run)} steps:"
                 f" {', '.join(s.describe() for s in run)}")
  items = layout.items_path_of(steps.checkpoint_of(path, step, step_given))
  tree = orbax_format.read_tree_layout(items)
  record = ConversionRecord.read(items)
  reader = CheckpointReader(items)
  if not reader.arrays:
    raise ConversionError(f"{items}: the checkpoint holds no arrays")
  lines += [f"checkpoint:        {items} (committed {_committed_at(items)})",
            f"storage:           {'OCDBT' if tree.use_ocdbt else 'a directory per leaf'},"
            f" {'zarr3' if tree.use_zarr3 else 'zarr v2'}, {len(reader.arrays)} arrays,"
            f" {sum(a.nbytes for a in reader.arrays.values()):,} bytes",
            "layers:            " + ("not recorded (told from the tree on the way back)" if record.scan_layers is None
                                     else "scanned (stacked)" if record.scan_layers else "unscanned"),
            f"chunking:          {record.chunking or 'not recorded (not written by hf2maxtext)'}"]
  lines += _record_lines(record)
  names = {key: leaf_name(key) for key in reader.arrays}
  width = max(len(name) for name in names.values())
  lines += ["", f"{'leaf':{width}}  {'shape':22}  {'dtype':8}  {'chunk':22}  {'stored block':22}  chunk codecs"]
  for key, array in sorted(reader.arrays.items()):
    lines.append(f"{names[key]:{width}}  {str(array.shape):22}  {array.dtype.name:8}"
                 f"  {str(reader.chunk_shape(array)):22}  {str(reader.block_shape(array)):22}"
                 f"  {_codecs(reader, array)}")
  return "\n".join(lines)
