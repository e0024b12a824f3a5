"""Writes LazyTensors into tensorstore arrays block by block, under one byte budget for the whole save."""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

import tensorstore as ts

from handlers import _orbax_private, claims, shares
from handlers.byte_budget import ByteBudget
from handlers.blocks import block_target_bytes, inner_chunk_shape, plan_blocks, write_shape
from handlers.lazy_tensor import LazyTensor, LazyTensorWriteError, brief_error
from handlers.write_options import BlockWritten, SaveCancelled, WriteOptions


async def _read(lazy: LazyTensor, index: tuple, options: WriteOptions) -> Any:
  early = options.early_reads.take(lazy.name, index) if options.early_reads is not None else None
  if early is not None:
    return await asyncio.wrap_future(early)
  return await asyncio.to_thread(lazy.read, index)


async def _write_block(
    store: ts.TensorStore, lazy: LazyTensor, array_name: str, index: tuple, nbytes: int, budget: ByteBudget,
    options: WriteOptions, failed: Sequence[BaseException] = (),
) -> None:
  try:
    block = await _read(lazy, index, options)
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

  blocks, located, sizes = plan_blocks(values, block_target_bytes(options.max_inflight_bytes))
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
      nbytes = sizes[number]
      # Checked once the budget has room: the save may have failed, or been cancelled, while this waited for it.
      await budget.acquire(nbytes)
      if errors:
        raise errors[0]
      _raise_if_cancelled(options)
      task = asyncio.create_task(_write_block(store, lazy, infos[leaf].name, index, nbytes, budget, options, errors))
      pending.add(task)
      task.add_done_callback(_finished)
    metadatas = [(await opened_leaf(leaf))[1] for leaf in range(len(values))]
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
