"""Writes LazyTensors into tensorstore arrays block by block, under one byte budget for the whole save."""

from __future__ import annotations

import asyncio
import math
from typing import Any, Sequence

import tensorstore as ts

from handlers import _orbax_private, claims, shares
from handlers.byte_budget import ByteBudget
from handlers.lazy_tensor import LazyTensor, LazyTensorWriteError, block_indices, brief_error
from handlers.write_options import BlockWritten, SaveCancelled, WriteOptions


async def _write_block(
    store: ts.TensorStore, lazy: LazyTensor, array_name: str, index: tuple, nbytes: int, budget: ByteBudget,
    options: WriteOptions, failed: Sequence[BaseException] = (),
) -> None:
  try:
    block = await asyncio.to_thread(lazy.read, index)
    if failed:  # The save is failing (see write_lazy_tensors): no new write that would only wait out its retries.
      return
    try:
      await store[index].write(block, can_reference_source_data_indefinitely=True)
    except Exception as e:
      raise LazyTensorWriteError(f"Failed to write tensor {lazy.name!r}: {brief_error(e)}") from e
  finally:
    await budget.release(nbytes)
  if options.on_block_written is not None:
    options.on_block_written(
        BlockWritten(array_name, tuple(s.start for s in index), tuple(s.stop for s in index), nbytes)
    )


# Below glibc's largest mmap threshold (32 MiB): a larger block is always a fresh mapping the kernel zeroes page by
# page before it is filled, and so is the chunk tensorstore decodes it into when it is read back; smaller ones
# are reused from the heap once freed.
TARGET_BLOCK_BYTES = 16 << 20


def _largest_divisor_at_most(n: int, limit: int) -> int:
  return max(d for d in range(1, max(1, min(n, limit)) + 1) if n % d == 0)


def write_block_shape(lazy: LazyTensor, target_bytes: int = TARGET_BLOCK_BYTES) -> tuple[int, ...]:
  """The loader's natural blocks, grouped along stacked axes up to about `target_bytes` per write.

  A natural block can be tiny (one expert of one layer), and every tensorstore write is a durable OCDBT commit,
  so writing them one by one is slow. Axes are grown outermost first, by whole divisors, so the blocks still
  tile the array exactly and a scanned MoE leaf (experts, layers, ...) is grouped by experts within one layer
  before it spans layers: a reader taking one layer at a time (the reverse conversion) decodes little else.
  """
  block = list(lazy.block_shape)
  for axis in range(len(block)):
    if block[axis] == lazy.shape[axis] or lazy.shape[axis] % block[axis]:
      continue
    block_bytes = math.prod(block) * lazy.itemsize
    factor = _largest_divisor_at_most(lazy.shape[axis] // block[axis], target_bytes // max(1, block_bytes))
    block[axis] *= factor
  return _aligned_to_device_shards(lazy, _aligned_to_chunks(lazy, block))


def _aligned_to_chunks(lazy: LazyTensor, block: list[int]) -> list[int]:
  """Blocks made of whole read chunks (`lazy.chunk_shape`), so that the chunks can be stored inside them: a block
  longer than a chunk is cut to a multiple of it, a shorter one to the largest divisor of it that keeps at least a
  quarter of the block (a 1365-row slab of 6144 rows becomes 1024 rows, which a reader's shards also divide); a
  chunk with no such divisor (a 151681-row vocabulary) keeps the block, which `inner_chunk_shape` then follows."""
  if lazy.chunk_shape is None:
    return block
  for axis, (b, c) in enumerate(zip(block, lazy.chunk_shape)):
    if b % c == 0 or b == lazy.shape[axis]:
      continue
    if b > c:
      block[axis] = c * (b // c)
    elif 4 * (divisor := _largest_divisor_at_most(c, b)) >= b:
      block[axis] = divisor
  return block


def inner_chunk_shape(lazy: LazyTensor, write: tuple[int, ...]) -> tuple[int, ...] | None:
  """The zarr3 inner chunk stored inside each write block (zarr3 inner chunks must divide their shard): the read
  chunk where the block holds it whole, else their largest common part, else (when that part would be tiny: a
  prime vocabulary against a slab of rows) the block's own extent on that axis."""
  if lazy.chunk_shape is None:
    return None
  inner = []
  for c, w in zip(lazy.chunk_shape, write):
    common = math.gcd(c, w)
    inner.append(common if 4 * common >= min(c, w) else w)
  return tuple(inner)


def _aligned_to_device_shards(lazy: LazyTensor, block: list[int]) -> tuple[int, ...]:
  """Blocks that straddle device shards make the stored grid (their gcd with the shards, see `write_shape`)
  needlessly fine: a 4681-row slab of a 16384-row table sharded 1024 rows a device would be stored one row per
  zarr shard. Along a sharded axis the loader reads partially (its block is not the whole axis), a block is
  therefore cut to the largest divisor of the device shard that keeps at least a quarter of it."""
  sharding = getattr(lazy, "sharding", None)
  if sharding is None:
    return tuple(block)
  for axis, (size, shard) in enumerate(zip(lazy.shape, sharding.shard_shape(lazy.shape))):
    b = block[axis]
    if b == size or shard == size or shard % b == 0 or b % shard == 0:
      continue
    if b > shard:
      block[axis] = shard * (b // shard)
    else:
      divisor = _largest_divisor_at_most(shard, b)
      block[axis] = divisor if 4 * divisor >= b else b
  return tuple(block)


def write_shape(lazy: LazyTensor, block: tuple[int, ...]) -> tuple[int, ...]:
  """The stored array's shard grid: the write blocks, split further along a device sharding if any.

  Orbax stores a sharded jax.Array with one zarr shard per device shard. Matching that exactly would need a
  whole device shard in memory (1/16 of a 150 GB leaf is still 9 GB), so each device shard is instead made of
  whole zarr shards no larger than a loader block: readers see the same array, restored per device without
  reading across shard boundaries.
  """
  sharding = getattr(lazy, "sharding", None)
  if sharding is None:
    return block
  shards = sharding.shard_shape(lazy.shape)
  # An unsharded axis keeps the block (its last one may be short); a sharded one is cut at device shards.
  return tuple(b if s == d else math.gcd(b, s) for b, s, d in zip(block, shards, lazy.shape))


async def _open(
    lazy: LazyTensor, block: tuple[int, ...], info: Any, arg: Any, metadata_key: str | None, create: bool
) -> tuple[ts.TensorStore, Any]:
  """Opens the stored array exactly as Orbax's handlers do, with the grid of `write_shape`: created by the
  primary process; the others assume its metadata (no I/O), as Orbax's own array writes do."""
  await info.await_path_creation()
  write = write_shape(lazy, block)
  spec = _orbax_private.build_array_write_spec(
      info=info,
      arg=arg,
      global_shape=lazy.shape,
      local_shape=write,
      dtype=lazy.dtype,
      use_ocdbt=info.is_ocdbt_checkpoint,
      process_index=_orbax_private.process_index_for_subdir(info.is_ocdbt_checkpoint),
      metadata_key=metadata_key,
  )
  json_spec = _orbax_private.with_inner_chunks(spec.json, inner_chunk_shape(lazy, write))
  try:
    if create:
      store = await ts.open(ts.Spec(json_spec), create=True, open=True, context=info.ts_context)
    else:
      store = await ts.open(ts.Spec(json_spec), open=True, assume_metadata=True, context=info.ts_context)
  except Exception as e:
    raise LazyTensorWriteError(f"Failed to create the array for tensor {lazy.name!r}: {brief_error(e)}") from e
  return store, spec.metadata


def block_target_bytes(max_inflight_bytes: int) -> int:
  """About how large a write block is under a byte budget: several blocks in flight keep both cores and the disk
  busy, so a small budget makes small blocks."""
  return min(TARGET_BLOCK_BYTES, max_inflight_bytes // 4)


def plan_blocks(values: Sequence[LazyTensor], target_bytes: int = TARGET_BLOCK_BYTES):
  """Each value's block shape (`write_block_shape`) and block indices, and every block's bytes, in order."""
  blocks = [write_block_shape(lazy, target_bytes) for lazy in values]
  indices = [list(block_indices(lazy.shape, block)) for lazy, block in zip(values, blocks)]
  sizes = [math.prod(s.stop - s.start for s in index) * lazy.itemsize
           for lazy, leaf_indices in zip(values, indices) for index in leaf_indices]
  return blocks, indices, sizes


def share_bytes(values: Sequence[LazyTensor], max_inflight_bytes: int, count: int) -> list[int]:
  """The bytes each of `count` processes writes when `values` are saved together (what --dry_run shows)."""
  _, _, sizes = plan_blocks(values, block_target_bytes(max_inflight_bytes))
  totals = [0] * count
  for nbytes, owner in zip(sizes, shares.owners(sizes, count)):
    totals[owner] += nbytes
  return totals


async def write_lazy_tensors(
    values: Sequence[LazyTensor], infos: Sequence[Any], args: Sequence[Any], *, options: WriteOptions,
    metadata_key: str | None = None,
) -> list[Any]:
  """Streams every value into its own stored array; returns Orbax's array metadata for each.

  Blocks are read on worker threads (numpy releases the GIL for copies, casts and transposes) while
  tensorstore compresses and writes earlier ones; at most `options.max_inflight_bytes` of blocks exist at a
  time. A block counts as written once tensorstore's write has completed, i.e. it is on disk. With several
  processes, each writes its share and then takes over what the others have not started of theirs
  (handlers/claims.py).
  """
  budget = ByteBudget(options.max_inflight_bytes)
  pending: set[asyncio.Task] = set()
  errors: list[BaseException] = []

  def _finished(task: asyncio.Task) -> None:
    pending.discard(task)
    if not task.cancelled() and task.exception() is not None:
      errors.append(task.exception())

  blocks, indices, sizes = plan_blocks(values, block_target_bytes(options.max_inflight_bytes))
  located = [(leaf, index) for leaf, leaf_indices in enumerate(indices) for index in leaf_indices]
  opened: dict[int, tuple[ts.TensorStore, Any]] = {}

  async def opened_leaf(leaf: int) -> tuple[ts.TensorStore, Any]:
    if leaf not in opened:  # The primary creates every array, the others open them without I/O: in any order.
      opened[leaf] = await _open(values[leaf], blocks[leaf], infos[leaf], args[leaf], metadata_key,
                                 create=options.processes.is_primary)
    return opened[leaf]

  try:
    share = infos[0].name if infos else ""
    for number in claims.claimed_blocks(sizes, options.processes, options.claims, share):
      leaf, index = located[number]
      lazy = values[leaf]
      store, _ = await opened_leaf(leaf)
      if errors:
        raise errors[0]
      if options.cancel is not None and options.cancel.is_set():
        raise SaveCancelled("the save was cancelled before every block was written")
      nbytes = sizes[number]
      await budget.acquire(nbytes)
      task = asyncio.create_task(_write_block(store, lazy, infos[leaf].name, index, nbytes, budget, options, errors))
      pending.add(task)
      task.add_done_callback(_finished)
    metadatas = [(await opened_leaf(leaf))[1] for leaf in range(len(values))]
    await asyncio.gather(*list(pending), return_exceptions=True)
    if errors:
      raise errors[0]
  except Exception:
    # Let the blocks in flight finish (or fail) before the error leaves. Cancelling their tasks would not stop
    # their writes: tensorstore still completes each one later, from its own thread, through this event loop,
    # which Orbax closes as soon as this coroutine returns; a write completing after that (its retries running
    # out once a bucket is down) printed a bare "RuntimeError: Event loop is closed" traceback. A block not yet
    # written is not started (`failed`); the ones that land are journaled for --resume as usual.
    await asyncio.gather(*list(pending), return_exceptions=True)
    raise
  except BaseException:
    for task in list(pending):
      task.cancel()
    raise
  return metadatas
