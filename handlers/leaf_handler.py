"""Orbax v1 leaf handlers that stream `LazyTensor`s into the checkpoint, recorded as ordinary arrays.

Orbax's own handlers take every leaf of a type in one `serialize` call and need each one whole in memory
(the numpy handler even deep-copies it), so the straightforward handler holds the model twice over. These
handlers keep Orbax's on-disk format (the same tensorstore specs, `_sharding` entries and array metadata) but
write each leaf block by block from its loader, at most `max_inflight_bytes` of blocks at a time.

`LazyTensor` leaves are recorded as "np.ndarray", `ShardedLazyTensor` leaves as "jax.Array": the typestr in
`_METADATA` is what every reader dispatches on, so v0 and v1 readers (and MaxText) restore them as usual.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from handlers import _orbax_private
from handlers.lazy_tensor import LazyTensor, ShardedLazyTensor
from handlers.streaming import write_lazy_tensors
from handlers.write_options import WriteOptions, configured

NUMPY_TYPESTR = "np.ndarray"
JAX_ARRAY_TYPESTR = "jax.Array"


@dataclasses.dataclass
class ShardedShapeDtype(_orbax_private.AbstractShardedArray):
  """The abstract type of `ShardedLazyTensor`.

  Registering with Orbax's own `AbstractShardedArray` and `override=True` would evict the jax.Array entry
  from the registry, so plain jax.Array leaves could no longer be saved beside ours.
  """

  shape: tuple[int, ...] | None
  dtype: Any | None
  sharding: Any | None = None


class _StreamingWrites:
  """A v0 type handler that writes LazyTensors itself and leaves everything else to Orbax's handler."""

  def __init__(self, base: Any, options: WriteOptions, *, sharded: bool):
    self._base = base
    self._options = options
    self._sharded = sharded

  def __getattr__(self, name: str) -> Any:
    return getattr(self._base, name)

  async def serialize(self, values: Sequence[LazyTensor], infos: Sequence[Any], args: Sequence[Any] | None = None):
    from orbax.checkpoint import type_handlers  # pylint: disable=g-import-not-at-top

    args = args or [type_handlers.SaveArgs()] * len(values)
    futures = []
    if self._sharded:
      futures.append(_orbax_private.CommitFuture(
          _orbax_private.serialize_shardings([v.sharding for v in values], infos,
                                             primary_host=self._options.processes.primary),
          name="lazy_tensor_shardings",
      ))
    futures.append(_orbax_private.CommitFuture(self._write(values, infos, args), name="lazy_tensor_writes"))
    return futures

  async def _write(self, values: Sequence[LazyTensor], infos: Sequence[Any], args: Sequence[Any]) -> None:
    store = getattr(self._base, "_array_metadata_store", None) if self._sharded else None
    if store is not None and infos and self._options.processes.is_primary:
      # Orbax's primary creates the array metadata directory only once its own share is written, and every other
      # process, done first, looks for it every 0.25 s: created now, it is there when they finish.
      await infos[0].await_path_creation()
      await _orbax_private.create_array_metadata_dir(store, infos[0].parent_dir)
    metadatas = await write_lazy_tensors(
        values, infos, args, options=self._options,
        metadata_key=getattr(self._base, "_metadata_key", None),
    )
    if store is not None:
      await store.write(checkpoint_dir=infos[0].parent_dir, array_metadatas=metadatas,
                        process_index=self._options.processes.index)


class LazyTensorLeafHandler(_orbax_private.NumpyLeafHandler):
  """`LazyTensor` leaves, written by streaming and recorded as numpy arrays."""

  write_options: WriteOptions = WriteOptions()

  def __init__(self, *, context: Any = None):
    super().__init__(context=context)
    self._handler_impl = _StreamingWrites(self._handler_impl, self.write_options, sharded=False)


class ShardedLazyTensorLeafHandler(_orbax_private.ArrayLeafHandler):
  """`ShardedLazyTensor` leaves, written by streaming and recorded as sharded jax.Arrays."""

  write_options: WriteOptions = WriteOptions()

  def __init__(self, *, context: Any = None):
    super().__init__(context=context)
    self._handler_impl = _StreamingWrites(self._handler_impl, self.write_options, sharded=True)


def add_lazy_tensor_leaf_handler(leaf_registry: Any, options: WriteOptions = WriteOptions()) -> Any:
  """Registers `LazyTensor` (as "np.ndarray") and `ShardedLazyTensor` (as "jax.Array") on `leaf_registry`."""
  leaf_registry.add(
      LazyTensor,
      _orbax_private.NumpyShapeDtype,
      configured(LazyTensorLeafHandler, options),
      override=True,
      secondary_typestrs=[NUMPY_TYPESTR],
  )
  leaf_registry.add(
      ShardedLazyTensor,
      ShardedShapeDtype,
      configured(ShardedLazyTensorLeafHandler, options),
      override=True,
      secondary_typestrs=[JAX_ARRAY_TYPESTR],
  )
  return leaf_registry
