"""MaxText -> HuggingFace: a converted (or MaxText-trained) Orbax checkpoint back to HF safetensors.

The plan (converter/reverse/reverse_plan.py) says which slice of which stored leaf becomes which HF tensor; here each
tensor is read slice by slice (converter/sources/checkpoint_reader.py), transformed, joined where the forward direction
split a fused tensor, and streamed into the current shard file, expert by expert for tensors holding every expert.
Pieces are read by worker threads (several in flight) while earlier ones are written, up to a byte budget
(`read_ahead_bytes`, the converter's --max_inflight_bytes). Memory: that budget (pieces: one expert of a tensor
holding every expert, a slab of rows of a large one, else one tensor) plus the open leaves' chunk caches.

The HF config comes from the checkpoint's conversion record (`hf2maxtext.hf_config`, recorded by the forward
direction) or from `hf_config_path`; it is written back as config.json with its dtype set to the checkpoint's and
without `quantization_config` (a quantized original comes back dequantized). The output directory, staged and
published whole or not at all, is converter/output/huggingface.py's.

Exactness: transposes, reshapes, splits, the RoPE permutation, vocab padding and stacking are undone bit for bit.
Query scaling (llama, mistral, mixtral targets) is float arithmetic, undone within 1 ulp (ops.DivideInFloat32); so
is Gemma's `w + 1` norm storage (within 1 ulp of |w| + 1). Vocab padding rows are dropped.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import json
import threading
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
from absl import logging

from converter import storage
from converter.reverse import serving_files
from converter.errors import ConversionError
from converter.options import ReverseOptions, RunContext
from converter.output.huggingface import HuggingFaceOutput
from handlers import shares
from handlers.shares import Processes
from converter.reverse.reverse_plan import HfPart, HfTensor, ReversePlan, items_path_of, plan_to_huggingface
from converter.reverse.safetensors_output import (INDEX_FILE, SafetensorsStreamWriter, assign_shards, index_json, parse_size,
                                          shard_names)

if TYPE_CHECKING:
  from converter.sources.checkpoint_reader import CheckpointReader, OpenArray



@dataclasses.dataclass(frozen=True)
class ToHuggingFaceResult:
  plan: ReversePlan
  output_dir: str
  files: tuple[str, ...]  # Safetensors files, in order.
  total_bytes: int
  written_files: tuple[str, ...] = ()  # The ones this process wrote (all of them for one process).
  serving_files: tuple[str, ...] = ()  # Copied from the original model: tokenizer, chat template, ...
  serving_warnings: tuple[str, ...] = ()
  merged_lora: Any = None  # The LoRA checkpoint merged in (lora_export.AdapterExport), when --lora_checkpoint_path.
  # What --verify recomputes: each file's tensors in the order written (all files, this process's or not), and the
  # LoRA merge (lora_export.Merge) they were computed with.
  shards: tuple[tuple[HfTensor, ...], ...] = ()
  merge: Any = None

  @property
  def num_tensors(self) -> int:
    return len(self.plan.tensors)

  @property
  def warnings(self) -> tuple[str, ...]:
    return self.plan.warnings + self.serving_warnings


# compression_config: compressed-tensors' older name, which vLLM reads when there is no quantization_config.
QUANTIZATION_KEYS = ("quantization_config", "compression_config", "expert_dtype")


def written_config(plan: ReversePlan) -> dict[str, Any]:
  """The original config.json with its dtype set to the dtype the tensors are written in, and no
  quantization_config (nor compression_config, nor DeepSeek V4's top-level `expert_dtype`, part of it): whatever the
  original stored quantized comes back dequantized. The family may rewrite the rest (`Family.config_back`).

  The dtype is written as `dtype` (what transformers 5 writes and reads, and vLLM through it), and as `torch_dtype`
  too where the original carries that key (hub configs written by transformers 4, which reads only it); a
  transformers 5 original gets no `torch_dtype` it did not have. The rules vLLM's config loading puts on the result
  are tools/testing/serving_config.py's."""
  config = plan.family.config_back({k: v for k, v in plan.hf_config.items() if k not in QUANTIZATION_KEYS})
  config["dtype"] = plan.dtype.name
  if "torch_dtype" in config:
    config["torch_dtype"] = plan.dtype.name
  text = config.get("text_config")
  if isinstance(text, dict):
    text = {k: v for k, v in text.items() if k not in QUANTIZATION_KEYS}
    config["text_config"] = {**text, **{k: plan.dtype.name for k in ("dtype", "torch_dtype") if k in text}}
  return config


def original_serving_files(plan: ReversePlan) -> tuple[dict[str, bytes], list[str]]:
  """The original model's tokenizer, chat template, generation and processor configs (converter/reverse/serving_files.py)
  and what to say about them: read before any weight, so that an unreachable original is said at once; without
  them the conversion goes on (the weights and config.json are still the model)."""
  instead = ("the output holds config.json and the weights only: pass --hf_config_path=<the original model's"
             " directory> to copy its tokenizer and serving files")
  if plan.original is None:
    return {}, [f"no original model is recorded in {plan.items_path} (a checkpoint written by MaxText, or by an older"
                f" converter); {instead}"]
  try:
    files = serving_files.read_serving_files(plan.original)
  except ConversionError as e:
    return {}, [f"{e}; {instead}"]
  missing = serving_files.missing(files)
  if missing:
    return files, [f"{plan.original.describe()} has no {', '.join(missing)}: the output cannot serve without them"]
  return files, []


def in_chunk_order(tensors: Sequence[HfTensor], reader: CheckpointReader) -> list[HfTensor]:
  """`tensors` with each run of consecutive tensors read from one leaf sorted (stably) by the stored chunk its
  first part starts in.

  The plan lists a stacked expert leaf expert by expert and layer by layer within each expert. Where a chunk holds
  several experts of one layer (as this converter writes them), that order decodes each chunk once per expert in
  it, and a model with 48 layers cycles through more chunks than any cache should hold; in chunk order every
  chunk's reads follow one another, whatever axes the chunks span (chunks spanning every layer, as Orbax
  writes a leaf sharded by device along its experts, keep the plan's order).
  """
  def first_chunk(tensor: HfTensor) -> tuple[int, ...]:
    part = tensor.pieces[0][0]
    return reader.first_chunk(reader.arrays[part.leaf], part.index)

  ordered: list[HfTensor] = []
  for _, run in itertools.groupby(tensors, key=lambda tensor: tensor.pieces[0][0].leaf):
    ordered += sorted(run, key=first_chunk)
  return ordered


class OpenLeaves:
  """The stored arrays the pieces being read need, each with its chunk cache; safe to use from several threads."""

  def __init__(self, reader: CheckpointReader, read_cache_bytes: int):
    self._reader = reader
    self._cache_bytes = read_cache_bytes
    self._open: dict[tuple[str, ...], OpenArray] = {}
    self._lock = threading.Lock()

  def keep_only(self, leaves: set[tuple[str, ...]]) -> None:
    with self._lock:
      for key in [k for k in self._open if k not in leaves]:
        del self._open[key]  # Frees that leaf's chunk cache before another one fills.

  def read(self, part: HfPart) -> np.ndarray:
    with self._lock:
      opened = self._open.get(part.leaf)
      if opened is None:
        opened = self._open[part.leaf] = self._reader.open(self._reader.arrays[part.leaf], part.index,
                                                           self._cache_bytes)
    value = opened.read(part.index)
    for op in part.ops:
      value = op(value)
    return value


def _piece(tensor: HfTensor, parts: tuple[HfPart, ...], leaves: OpenLeaves, merge: Any = None) -> np.ndarray:
  """One piece of `tensor`: its single part, or its fused parts each placed where the forward direction split it;
  with a LoRA `merge` (lora_export.Merge) that adapts it, plus the update."""
  if len(parts) == 1 and parts[0].split is None:
    value = leaves.read(parts[0])
  else:
    value = np.empty(tensor.piece_shape, tensor.dtype)
    for part in parts:
      part.split.place(value, leaves.read(part))
  module = merge.weights.get(tensor.name) if merge is not None else None
  if module is not None:
    return merge.merged(module, value, tensor.dtype)  # A linear weight: one piece, (out, in).
  return value if value.dtype == tensor.dtype else value.astype(tensor.dtype)


class ReadAhead:
  """The pieces of `items` (tensor, parts) in order, read by worker threads ahead of the caller, who writes them;
  at most `max_bytes` of pieces read (or being read) and not yet written at once (a larger piece still passes,
  alone).

  A read decodes zstd chunks on one core and a write is the kernel copying into the page cache: read one after
  the other, the pieces took twice the slower of the two. Several reads in flight decode chunks on every core
  while the caller writes. Only the leaves the pieces in flight need stay open, so their chunk caches are all
  that is cached.

  Pieces in chunk order (`in_chunk_order`) share chunks: the reads of the experts one chunk holds all wait on
  that chunk's single decode. With 4 workers, all 4 waited on one chunk and one core decoded while the other
  idled; with 16, the reads in flight reach the next chunks too. A waiting worker costs nothing, and the byte
  budget still bounds what is held.
  """

  WORKERS = 16

  def __init__(self, items: list[tuple[HfTensor, tuple[HfPart, ...]]], leaves: OpenLeaves, max_bytes: int,
               merge: Any = None):
    self._items = items
    self._merge = merge
    self._leaves = leaves
    self._max_bytes = max_bytes
    self._pool = concurrent.futures.ThreadPoolExecutor(self.WORKERS, thread_name_prefix="hf2maxtext-read")
    self._in_flight: collections.deque = collections.deque()

  @staticmethod
  def _expected_bytes(tensor: HfTensor) -> int:
    return tensor.nbytes // len(tensor.pieces)

  def __iter__(self):
    alive = 0
    submitted = 0
    for _ in range(len(self._items)):
      while submitted < len(self._items) and len(self._in_flight) < 2 * self.WORKERS:
        tensor, parts = self._items[submitted]
        if self._in_flight and alive + self._expected_bytes(tensor) > self._max_bytes:
          break
        self._leaves.keep_only({p.leaf for _, in_flight, _ in self._in_flight for p in in_flight} |
                               {p.leaf for p in parts})
        self._in_flight.append((tensor, parts, self._pool.submit(_piece, tensor, parts, self._leaves, self._merge)))
        alive += self._expected_bytes(tensor)
        submitted += 1
      tensor, _, future = self._in_flight[0]
      value = future.result()  # Raises the read's error, in order.
      self._in_flight.popleft()
      yield tensor, value
      alive -= self._expected_bytes(tensor)
      del value

  def close(self) -> None:
    for _, _, future in self._in_flight:
      future.cancel()
    self._pool.shutdown(wait=True)


def _write_shards(reader: CheckpointReader, directory: str, shards: list[list[HfTensor]], names: list[str],
                  options: ReverseOptions, processes: Processes, finished: Callable[[str], None],
                  merge: Any = None) -> list[str]:
  """Writes this process's shards (all of them for one process; a byte-balanced run of them for several), each
  handed to `finished` once closed; returns the names of those this process wrote."""
  owners = shares.owners([sum(t.spec.nbytes for t in shard) for shard in shards], processes.count)
  mine = [(name, shard) for name, shard, owner in zip(names, shards, owners) if owner == processes.index]
  items = [(tensor, parts) for _, shard in mine for tensor in shard for parts in tensor.pieces]
  pieces = ReadAhead(items, OpenLeaves(reader, options.read_cache_bytes), options.read_ahead_bytes, merge)
  try:
    arriving = iter(pieces)
    for file_name, shard in mine:
      path = storage.join(directory, file_name)
      writer = SafetensorsStreamWriter(path, [t.spec for t in shard])
      try:
        for _ in range(sum(len(t.pieces) for t in shard)):
          tensor, value = next(arriving)
          writer.write(tensor.name, value, piece=tensor.in_pieces)
      except BaseException:
        writer.abort()
        raise
      writer.close()
      finished(path)
  finally:
    pieces.close()
  return [name for name, _ in mine]


def check_constants(plan: ReversePlan, reader: CheckpointReader, cache_bytes: int) -> None:
  """Refuses a checkpoint whose leaves without an HF tensor (ReversePlan.constants) left their fixed value: HF
  computes with that value, so dropping what MaxText learned there would silently change the model."""
  for keys, value in plan.constants:
    array = reader.arrays[keys]
    stored = reader.open(array, (), cache_bytes).read(())
    if not np.all(stored == value):
      raise ConversionError(
          f"{plan.items_path}: leaf {'/'.join(keys)} is not {value:g} everywhere (max|leaf - {value:g}| ="
          f" {float(np.max(np.abs(stored.astype(np.float64) - value))):.3g}); {plan.config.architecture} has no"
          " tensor for it (it computes with the fixed value), so the checkpoint cannot be written back without"
          " changing the model")


@dataclasses.dataclass(frozen=True)
class WayBack:
  """What a conversion back writes, planned from the checkpoint's metadata alone (no weight read): the plan, the
  files in order with the tensors each holds (in the order written), and a LoRA checkpoint merged in."""

  plan: ReversePlan
  reader: CheckpointReader
  shards: tuple[tuple[HfTensor, ...], ...]
  names: tuple[str, ...]
  merge: Any = None  # lora_export.Merge, with --lora_checkpoint_path.


def plan_way_back(checkpoint_path: str, options: ReverseOptions) -> WayBack:
  """`checkpoint_path`'s way back, as convert_to_huggingface writes it and --dry_run describes it."""
  limit = parse_size(options.max_shard_size)
  from converter.sources.checkpoint_reader import CheckpointReader  # pylint: disable=g-import-not-at-top

  items_path = items_path_of(checkpoint_path)
  reader = CheckpointReader(items_path, dequantize_fp8=True)
  plan = plan_to_huggingface(items_path, family=options.family, hf_config_path=options.hf_config_path,
                             target_model=options.target_model, reader=reader)
  merge = None
  if options.lora_checkpoint_path:
    from converter.lora import lora_export  # pylint: disable=g-import-not-at-top

    merge = lora_export.plan_merge(options.lora_checkpoint_path, options, plan.family.name, plan.target_model,
                                   (plan.hf_config, plan.config.path))
    unmerged = sorted(set(merge.weights) - {t.name for t in plan.tensors if len(t.pieces) == 1})
    if unmerged:
      raise ConversionError(f"{merge.export.items_path}: LoRA factors for {', '.join(unmerged[:3])}, which the base"
                            f" {items_path} does not write back as one (out, in) weight")
  tensors = in_chunk_order(plan.tensors, reader)
  shards = tuple(tuple(tensors[i] for i in shard) for shard in assign_shards([t.spec for t in tensors], limit))
  return WayBack(plan, reader, shards, tuple(shard_names(len(shards))), merge)


def convert_to_huggingface(checkpoint_path: str, output_dir: str, options: ReverseOptions = ReverseOptions(),
                           run: RunContext = RunContext()) -> ToHuggingFaceResult:
  """Writes `checkpoint_path` (OUT/0/items) as an HF checkpoint directory `output_dir`; see the module docstring.

  With several processes each writes its share of the shards into the output (converter/output/huggingface.py).
  """
  output_dir = storage.resolve(output_dir)
  way_back = plan_way_back(checkpoint_path, options)
  plan, reader, shards, names, merge = way_back.plan, way_back.reader, way_back.shards, way_back.names, way_back.merge
  for warning in plan.warnings:
    logging.warning("%s", warning)
  check_constants(plan, reader, options.read_cache_bytes)
  serving, serving_warnings = original_serving_files(plan) if run.processes.is_primary else ({}, [])
  for warning in serving_warnings:
    logging.warning("%s", warning)
  mine: list[str] = []

  def write_shards(directory: str, finished: Callable[[str], None]) -> None:
    mine.extend(_write_shards(reader, directory, shards, names, options, run.processes, finished, merge))

  def last_files() -> dict[str, str]:
    files = {}
    if len(names) > 1:
      index = index_json([t.spec for shard in shards for t in shard],
                         {t.name: name for name, shard in zip(names, shards) for t in shard})
      files[INDEX_FILE] = json.dumps(index, indent=2) + "\n"
    files["config.json"] = json.dumps(written_config(plan), indent=2, sort_keys=True) + "\n"
    return {**serving, **files}

  HuggingFaceOutput(output_dir, run, hub_private=options.hub_private).write(write_shards, last_files)
  return ToHuggingFaceResult(plan, output_dir, names, plan.total_bytes, tuple(mine), tuple(serving),
                             tuple(serving_warnings), merge.export if merge else None, shards, merge)
