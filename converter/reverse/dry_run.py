"""`--dry_run` on the way back: the files it would write, each HF tensor's source leaf, and the memory it would take,
from the checkpoint's metadata alone (no weight read, nothing written).

Memory is predicted from the way back's own model (to_huggingface.ReadAhead and OpenLeaves): the pieces read ahead
of the writes (at most the budget, at least the largest piece; a LoRA-merged piece also holds float32 copies), plus
the chunk caches of the leaves those pieces read, which stay open while any of their pieces is in flight, each
holding the chunks decoded so far up to its cache's size (checkpoint_reader.cache_bytes). The in-flight window is
walked as ReadAhead walks it, and the largest sum of open caches taken.
"""

from __future__ import annotations

import math
from typing import Any

from converter.arrays import human_bytes
from converter.checkpoint_format.record import leaf_name
from converter.options import ReverseOptions
from converter.reverse.reverse_plan import HfPart, HfTensor
from converter.reverse.safetensors_output import INDEX_FILE
from converter.reverse.to_huggingface import ReadAhead, WayBack

# Set so that the prediction bounds the peaks measured beside it (docs/reverse.md): each byte read ahead is held
# about twice (the piece, and the contiguous copy the writer makes of a transposed one), plus what the reads hold
# whatever the budget (the worker threads' arenas and read buffers, TensorStore's open stores).
INFLIGHT_OVERHEAD = 2.0
WRITER_BYTES = 48 << 20


def _show_index(index: tuple[Any, ...]) -> str:
  def one(i: Any) -> str:
    if not isinstance(i, slice):
      return str(i)
    return ":" if i.start is None and i.stop is None else f"{i.start or 0}:{'' if i.stop is None else i.stop}"

  return "[" + ", ".join(one(i) for i in index) + "]" if index else ""


def _source(tensor: HfTensor) -> str:
  """Where `tensor` is read from: its first piece's leaf (or fused leaves) and index, and how many pieces."""
  parts = " + ".join(leaf_name(part.leaf) + _show_index(part.index) for part in tensor.pieces[0])
  if len(tensor.pieces) > 1:
    parts += f" ... ({len(tensor.pieces)} pieces)"
  return parts


def _open_cache_bytes(way_back: WayBack, part: HfPart, limit: int) -> int:
  """What the chunk cache of `part`'s leaf holds at most while open: the chunks decoded, up to its size."""
  from converter.sources.checkpoint_reader import cache_bytes  # pylint: disable=g-import-not-at-top

  reader = way_back.reader
  array = reader.arrays[part.leaf]
  stored = array.fp8 if array.fp8 is not None else (array,)
  total = 0
  for one in stored:
    index = part.index if one is stored[0] else tuple(i if isinstance(i, slice) else 0 for i in part.index)
    chunk = reader.chunk_shape(one)
    chunk_bytes = math.prod(chunk) * one.dtype.itemsize
    total += min(cache_bytes(one, chunk, index, limit), max(one.nbytes, chunk_bytes))
  return total


def predicted_peak_bytes(way_back: WayBack, options: ReverseOptions, baseline_bytes: int) -> tuple[int, int]:
  """The process's predicted peak RSS, and the open leaves' chunk caches' share of it: the baseline (this process,
  planned, as the conversion's is when it starts reading) plus the writer's share, the pieces in flight and the
  chunk caches of the leaves they read, walked in the order and within the budget the conversion reads them."""
  merged = set(way_back.merge.weights) if way_back.merge is not None else set()
  items = [(tensor, parts) for shard in way_back.shards for tensor in shard for parts in tensor.pieces]
  piece = [tensor.nbytes // len(tensor.pieces) for tensor, _ in items]  # What ReadAhead counts against the budget.
  held = [size + (2 * size * 4 // tensor.dtype.itemsize if tensor.name in merged else 0)
          for size, (tensor, _) in zip(piece, items)]
  caches: dict[tuple[str, ...], int] = {}
  inflight = largest_caches = 0
  window: list[int] = []  # Indices of the items in flight, as ReadAhead admits them.
  alive = 0
  for i, (tensor, parts) in enumerate(items):
    while window and (len(window) >= 2 * ReadAhead.WORKERS or alive + piece[i] > options.read_ahead_bytes):
      alive -= piece[window.pop(0)]
    window.append(i)
    alive += piece[i]
    inflight = max(inflight, sum(held[j] for j in window))
    for part in parts:
      if part.leaf not in caches:
        caches[part.leaf] = _open_cache_bytes(way_back, part, options.read_cache_bytes)
    open_leaves = {part.leaf for j in window for part in items[j][1]}
    largest_caches = max(largest_caches, sum(caches[leaf] for leaf in open_leaves))
  peak = baseline_bytes + WRITER_BYTES + INFLIGHT_OVERHEAD * inflight + largest_caches
  return int(peak), largest_caches


def describe(way_back: WayBack, options: ReverseOptions, *, baseline_bytes: int) -> str:
  """The way back's plan as text, in the forward dry run's form (converter/dry_run.py)."""
  plan = way_back.plan
  lines = [f"{plan.family.name} ({plan.config.architecture}) <- MaxText {plan.target_model},"
           f" {'scanned' if plan.scan_layers else 'unscanned'}, {plan.dtype.name}: {plan.items_path}", ""]
  rows = [(tensor, shard) for shard, tensors in enumerate(way_back.shards, 1) for tensor in tensors]
  width = max(len(tensor.name) for tensor, _ in rows)
  lines.append(f"{'tensor':{width}}  {'shape':22}  {'dtype':8}  {'bytes':>12}  {'shard':>5}  source")
  for tensor, shard in rows:
    lines.append(f"{tensor.name:{width}}  {str(tensor.shape):22}  {tensor.dtype.name:8}  {tensor.nbytes:>12,}"
                 f"  {shard:>5}  {_source(tensor)}")
  peak, caches = predicted_peak_bytes(way_back, options, baseline_bytes)
  inexact = len(plan.inexact_tensors)
  lines += ["", f"tensors:           {len(plan.tensors)}" + (f" ({inexact} undone in float arithmetic, within one"
                                                             " ulp)" if inexact else "")]
  lines.append(f"bytes to write:    {plan.total_bytes:,} ({human_bytes(plan.total_bytes)})")
  lines.append(f"shards:            {len(way_back.names)} (--max_shard_size={options.max_shard_size})")
  for name, shard in zip(way_back.names, way_back.shards):
    lines.append(f"file:              {name}: {len(shard)} tensors, {sum(t.nbytes for t in shard):,} bytes")
  others = ([INDEX_FILE] if len(way_back.names) > 1 else []) + ["config.json"]
  original = (f"the original's tokenizer and serving files from {plan.original.describe()}" if plan.original else
              "no original recorded: no tokenizer (pass --hf_config_path=<the original model's directory>)")
  lines.append(f"file:              {', '.join(others)}; {original}")
  if way_back.merge is not None:
    export = way_back.merge.export
    lines.append(f"lora:              {len(export.modules)} modules merged in float32, r {export.rank}, lora_alpha"
                 f" {export.alpha:g}, from {export.items_path}")
  lines.append(f"predicted peak RSS: {human_bytes(peak)} (read ahead {human_bytes(options.read_ahead_bytes)}, open leaves'"
               f" chunk caches up to {human_bytes(caches)})")
  lines += [f"warning: {w}" for w in plan.warnings]
  return "\n".join(lines)
