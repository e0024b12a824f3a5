"""`--dry_run`: the plan, from headers and config.json alone, before an hour is spent on it."""

from __future__ import annotations

import collections
import math

from converter import storage
from converter.arrays import human_bytes
from converter.layout import chunking
from converter.planning import loaders
from converter.planning.lazy_leaves import write_blocks
from converter.planning.plan import Plan
from handlers.blocks import host_group, inner_chunk_shape, write_shape

# Fitted to the peaks tools/benchmark.py and tools/memory_benchmark.py measure beside each prediction
# (docs/memory-and-streaming.md): every byte of the budget in flight holds about this many resident (the block,
# and tensorstore's encoded shard of it until it is on disk), plus a share the writer holds whatever the budget
# (its thread pools' arenas, OCDBT's manifest, the heap's high-water mark, the loader threads' pieces), plus a
# MaxText source's chunk caches. Dequantizing sources peak no higher than others since the B-tree cache went.
INFLIGHT_OVERHEAD = 1.8
WRITER_BYTES = 72 << 20


def predicted_peak_bytes(plan: Plan, baseline_bytes: int, max_inflight_bytes: int,
                         block_shapes: list | None = None) -> int:
  """Process baseline (this process, planned: what the conversion's has too) plus the writer's share, the blocks in
  flight (at most the budget, at least the largest block) with their encoded copies, a source's read cache and
  what its storage's connections hold; `block_shapes`: the writer's cut under this budget, when the caller has it
  already."""
  if block_shapes is None:
    _, block_shapes, _, _ = write_blocks(plan, max_inflight_bytes)
  largest_block = max(math.prod(block) * leaf.dtype.itemsize for leaf, block in zip(plan.leaves, block_shapes))
  inflight = min(max(max_inflight_bytes, largest_block), plan.total_bytes)
  reading = plan.source.read_cache_bytes + storage.read_overhead_bytes(plan.source.location)
  return int(baseline_bytes + WRITER_BYTES + INFLIGHT_OVERHEAD * inflight + reading)


def stored_leaves(plan: Plan, lazies: list, block_shapes: list, max_inflight_bytes: int
                  ) -> list[chunking.StoredLeaf]:
  """Each leaf as one process stores it: its read chunks inside its stored blocks (handlers.blocks), from the
  writer's cut (`write_blocks`)."""
  out = []
  for leaf, lazy, block in zip(plan.leaves, lazies, block_shapes):
    stored = write_shape(lazy, tuple(block), host_group(lazy, tuple(block), max_inflight_bytes).scale)
    chunk = inner_chunk_shape(lazy, stored) or tuple(block)
    out.append(chunking.StoredLeaf(leaf.shape, chunk, leaf.dtype.itemsize,
                                   leaf.logical_axes or (None,) * len(leaf.shape), stored))
  return out


def _read_formats(plan: Plan) -> collections.Counter[str]:
  """How many of the tensors the leaves read are stored in each format. Not every tensor of the source: those the
  plan skips (DeepSeek's multi-token-prediction layers, rotary caches) are never read, so are not counted. A
  tensor is counted once per leaf, however many of its experts the leaf reads, as the leaf's `sources` list it."""
  formats: collections.Counter[str] = collections.Counter()
  for leaf in plan.leaves:
    formats.update({tensor.name: tensor.format for tensor in leaf.loader.source_tensors()}.values())
  return formats


def describe(plan: Plan, *, baseline_bytes: int, max_inflight_bytes: int, shares: list[int] | None = None) -> str:
  """The plan as text; `shares`: the bytes each process would write (several processes)."""
  quantized = plan.source.quant_method
  if plan.fp8:
    quantized = plan.source.facts.quant_method  # A native fp8 checkpoint laid out again: its original's format.
    reading = (f"; {quantized} kernels kept as {plan.fp8.weight_dtype} with their scales"
               f" ({plan.fp8.block}-element blocks), the rest dequantized")
  else:
    reading = f"; {quantized} weights dequantized while streaming" if quantized else ""
  lines = [f"{plan.family.name} ({plan.config.architecture}) -> MaxText {plan.target_model},"
           f" {'scanned' if plan.scan_layers else 'unscanned'}, {plan.save_dtype.name}" + reading, ""]
  width = max(len(leaf.name) for leaf in plan.leaves)
  formats = {leaf.name: " + ".join(leaf.formats) for leaf in plan.leaves}
  format_width = max(len(f) for f in formats.values())
  lines.append(f"{'leaf':{width}}  {'shape':22}  {'dtype':8}  {'bytes':>12}  {'source format':{format_width}}  sources")
  for leaf in plan.leaves:
    sources = ", ".join(leaf.sources[:2]) + (f" ... ({len(leaf.sources)} tensors)" if len(leaf.sources) > 2 else "")
    lines.append(f"{leaf.name:{width}}  {str(leaf.shape):22}  {leaf.dtype.name:8}  {leaf.nbytes:>12,}"
                 f"  {formats[leaf.name]:{format_width}}  {sources}")
  tensors = _read_formats(plan)
  lazies, block_shapes, _, _ = write_blocks(plan, max_inflight_bytes)
  transposed = sum(leaf.nbytes for leaf in plan.leaves if loaders.transposes(leaf.loader))
  lines += [
      "",
      f"leaves:            {len(plan.leaves)}",
      f"source tensors:    {sum(tensors.values())} ({', '.join(f'{n} {f}' for f, n in sorted(tensors.items()))})",
      f"bytes to write:    {plan.total_bytes:,} ({human_bytes(plan.total_bytes)})",
      f"transposed bytes:  {transposed:,} ({transposed / max(1, plan.total_bytes):.0%}: HF and MaxText order their"
      " axes differently)",
      f"predicted peak RSS: {human_bytes(predicted_peak_bytes(plan, baseline_bytes, max_inflight_bytes, block_shapes))}"
      f" (budget {human_bytes(max_inflight_bytes)})",
  ]
  meshes = (plan.chunking.target_mesh,) if plan.chunking.target_mesh else chunking.DEFAULT_MESHES
  lines.append(f"chunks:            {plan.chunking.record()}")
  lines += chunking.restore_lines(stored_leaves(plan, lazies, block_shapes, max_inflight_bytes), meshes)
  for index, nbytes in enumerate(shares or []) if shares and len(shares) > 1 else ():
    lines.append(f"process {index} writes: {nbytes:,} bytes ({nbytes / max(1, plan.total_bytes):.1%})")
  lines += [f"warning: {w}" for w in plan.warnings]
  return "\n".join(lines)
