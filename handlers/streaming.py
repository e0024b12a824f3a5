"""Writes LazyTensors into tensorstore arrays block by block, under one byte budget for the whole save."""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Awaitable, Callable, Sequence

import tensorstore as ts

from handlers import _orbax_private, claims, host_databases, shares
from handlers.byte_budget import ByteBudget
from handlers.blocks import (block_target_bytes, host_group, host_parts, inner_chunk_shape, plan_blocks, region_bytes,
                             write_shape)
from handlers.lazy_tensor import LazyTensor, LazyTensorWriteError, brief_error
from handlers.write_options import BlockWritten, SaveCancelled, WriteOptions


async def _read(lazy: LazyTensor, index: tuple, options: WriteOptions) -> Any:
  early = options.early_reads.take(lazy.name, index) if options.early_reads is not None else None
  if early is not None:
    return await asyncio.wrap_future(early)
  return await asyncio.to_thread(lazy.read, index)


StoreFor = Callable[[int], Awaitable[tuple[ts.TensorStore, str | None]]]


async def _write_block(
    store_for: StoreFor, lazy: LazyTensor, array_name: str, index: tuple, options: WriteOptions,
    failed: Sequence[BaseException] = (),
) -> BlockWritten | None:
  """Reads the block `index` and writes it, each restoring host's piece (`host_parts`) into the store
  `store_for(part)` gives with its database (None: the writing process's own); returns what was written."""
  block = await _read(lazy, index, options)
  if failed:  # The save is failing (see write_lazy_tensors): no new write that would only wait out its retries.
    return None
  pieces = []
  for part, piece in host_parts(lazy, index):
    store, database = await store_for(part)
    within = tuple(slice(p.start - s.start, p.stop - s.start) for p, s in zip(piece, index))
    try:
      await store[piece].write(block[within], can_reference_source_data_indefinitely=True)
    except Exception as e:
      raise LazyTensorWriteError(f"Failed to write tensor {lazy.name!r}: {brief_error(e)}") from e
    if database is not None:
      pieces.append((tuple(s.start for s in piece), tuple(s.stop for s in piece), database))
  return BlockWritten(array_name, tuple(s.start for s in index), tuple(s.stop for s in index),
                      region_bytes(lazy, index), tuple(pieces))


def _always(store: ts.TensorStore) -> StoreFor:
  """Every part of a block into `store`, the writing process's own database."""

  async def store_for(part: int) -> tuple[ts.TensorStore, None]:
    del part
    return store, None

  return store_for


async def _written_now(write: Awaitable[BlockWritten | None], nbytes: int, budget: ByteBudget,
                       options: WriteOptions) -> None:
  """A block written outside any transaction: on disk once its write completes."""
  try:
    written = await write
  finally:
    await budget.release(nbytes)
  if written is not None and options.on_block_written is not None:
    options.on_block_written(written)


async def _open(
    lazy: LazyTensor, write: tuple[int, ...], info: Any, arg: Any, metadata_key: str | None, create: bool,
    database: str | None = None,
) -> tuple[ts.TensorStore, Any]:
  """Opens the stored array exactly as Orbax's handlers do, with the grid `write` (`write_shape`): created by the
  primary process; the others assume its metadata (no I/O), as Orbax's own array writes do. Its blocks go to
  the writing process's own OCDBT database, or to `database` (`host_databases.database_name`)."""
  await info.await_path_creation()
  spec = _orbax_private.build_array_write_spec(
      info=info,
      arg=arg,
      global_shape=lazy.shape,
      local_shape=write,
      dtype=lazy.dtype,
      use_ocdbt=info.is_ocdbt_checkpoint,
      process_index=database or _orbax_private.process_index_for_subdir(info.is_ocdbt_checkpoint),
      metadata_key=metadata_key,
  )
  json_spec = _orbax_private.with_inner_chunks(spec.json, inner_chunk_shape(lazy, write), lazy.chunk_order,
                                                 lazy.element_order)
  try:
    if create:
      store = await ts.open(ts.Spec(json_spec), create=True, open=True, context=info.ts_context)
    else:
      store = await ts.open(ts.Spec(json_spec), open=True, assume_metadata=True, context=info.ts_context)
  except Exception as e:
    raise LazyTensorWriteError(f"Failed to create the array for tensor {lazy.name!r}: {brief_error(e)}") from e
  return store, spec.metadata


def _raise_if_cancelled(options: WriteOptions) -> None:
  if options.cancel is not None and options.cancel.is_set():
    raise SaveCancelled("the save was cancelled before every block was written")


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
  time. A block counts as written once tensorstore's write has completed, i.e. it is on disk; a leaf whose
  restoring hosts' parts are stored apart (`LazyTensor.host_shape`) is written in pieces into their databases, a
  round of blocks per commit (handlers/host_databases.py), each block written once its round is. With several
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

  def _track(task: asyncio.Task) -> None:
    pending.add(task)
    task.add_done_callback(_finished)

  async def _staged(leaf: int, lazy: LazyTensor, array_name: str, index: tuple,
                    transaction: Callable[[str], ts.Transaction]) -> BlockWritten | None:
    return await _write_block(lambda part: part_store(leaf, part, transaction), lazy, array_name, index, options,
                              errors)

  blocks, located, sizes = plan_blocks(values, block_target_bytes(options.max_inflight_bytes))
  opened: dict[int, tuple[ts.TensorStore, Any]] = {}
  parts_opened: dict[tuple[int, int], asyncio.Task] = {}  # Opened once, however many blocks ask at a time.
  rounds = None
  if any(lazy.host_shape is not None for lazy in values) and infos and infos[0].is_ocdbt_checkpoint:
    rounds = host_databases.CommitRounds(budget, options.max_inflight_bytes // 4, options.on_block_written, _track)
  # Consecutive blocks whose pieces one stored block holds: written by one process, in one round.
  groups = [host_group(lazy, block, options.max_inflight_bytes) if rounds and options.processes.count == 1 else None
            for lazy, block in zip(values, blocks)]
  stored = [write_shape(lazy, block, group and group.scale) for lazy, block, group in zip(values, blocks, groups)]
  per_group = [group.blocks if group else 1 for group in groups]
  staged = [0] * len(values)
  block_counts = [0] * len(values)
  for leaf, _ in located:
    block_counts[leaf] += 1

  async def opened_leaf(leaf: int) -> tuple[ts.TensorStore, Any]:
    if leaf not in opened:  # The primary creates every array, the others open them without I/O: in any order.
      opened[leaf] = await _open(values[leaf], stored[leaf], infos[leaf], args[leaf], metadata_key,
                                 create=options.processes.is_primary)
    return opened[leaf]

  async def part_store(leaf: int, part: int, transaction: Callable[[str], ts.Transaction]
                       ) -> tuple[ts.TensorStore, str]:
    """The array `leaf` in part `part`'s database, within that database's transaction of the current round."""
    await opened_leaf(leaf)  # Created (by the primary) before any process writes a block of it.
    database = host_databases.database_name(
        _orbax_private.process_index_for_subdir(infos[leaf].is_ocdbt_checkpoint), part)
    if (leaf, part) not in parts_opened:
      parts_opened[leaf, part] = asyncio.ensure_future(_open(
          values[leaf], stored[leaf], infos[leaf], args[leaf], metadata_key, create=False, database=database))
    store, _ = await parts_opened[leaf, part]
    return store.with_transaction(transaction(database)), database

  try:
    share = infos[0].name if infos else ""
    for number in claims.claimed_blocks(sizes, options.processes, options.claims, share):
      leaf, index = located[number]
      lazy = values[leaf]
      store, _ = await opened_leaf(leaf)
      nbytes = sizes[number]
      # Checked once the budget has room: the save may have failed, or been cancelled, while this waited for it.
      await budget.acquire(nbytes)
      if errors:
        raise errors[0]
      _raise_if_cancelled(options)
      if rounds is not None and lazy.host_shape is not None:
        staged[leaf] += 1
        rounds.add(functools.partial(_staged, leaf, lazy, infos[leaf].name, index), nbytes,
                   group_ends=staged[leaf] % per_group[leaf] == 0 or staged[leaf] == block_counts[leaf])
        continue
      _track(asyncio.create_task(_written_now(
          _write_block(_always(store), lazy, infos[leaf].name, index, options, errors), nbytes, budget, options)))
    metadatas = [(await opened_leaf(leaf))[1] for leaf in range(len(values))]
    if rounds is not None:
      await rounds.finish()
    await asyncio.gather(*list(pending), return_exceptions=True)
    if errors:
      raise errors[0]
    _raise_if_cancelled(options)  # Stopped while the last blocks were in flight: still nothing committed.
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
