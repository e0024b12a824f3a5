"""Orbax v1 leaf handler that writes `LazyTensor`s as ordinary numpy arrays, a byte budget at a time."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Awaitable, Iterator, Sequence

import numpy as np

from handlers import _orbax_private
from handlers.lazy_tensor import LazyTensor

DEFAULT_MAX_INFLIGHT_BYTES = 1 << 30

# The typestr recorded in `_METADATA` for every LazyTensor leaf. Orbax records the first secondary typestr of
# the handler; without this it records the handler's class path and no v0 reader can restore the leaf.
NUMPY_TYPESTR = "np.ndarray"


def batches_under_budget(params: Sequence[Any], max_bytes: int) -> Iterator[list[Any]]:
  """Groups params in order so that each group's LazyTensors total at most `max_bytes` (one leaf if larger)."""
  batch, batch_bytes = [], 0
  for param in params:
    nbytes = param.value.nbytes
    if batch and batch_bytes + nbytes > max_bytes:
      yield batch
      batch, batch_bytes = [], 0
    batch.append(param)
    batch_bytes += nbytes
  if batch:
    yield batch


class LazyTensorLeafHandler(_orbax_private.NumpyLeafHandler):
  """Materialises `LazyTensor` leaves to their declared dtype and defers the write to the numpy handler.

  Orbax hands a leaf handler every leaf of its type in one `serialize` call. Materialising them all there
  would hold the whole model in memory twice over (Orbax's numpy path deep-copies each array), so the values
  are produced and written in the background, a batch of at most `max_inflight_bytes` at a time.
  """

  max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES

  async def serialize(self, params: Sequence[Any], serialization_context: Any) -> Awaitable[None]:
    return self._write_in_batches(list(params), serialization_context)

  async def _write_in_batches(self, params: list[Any], serialization_context: Any) -> None:
    parent_serialize = super().serialize
    for batch in batches_under_budget(params, self.max_inflight_bytes):
      arrays = await asyncio.gather(*(asyncio.to_thread(np.asarray, p.value) for p in batch))
      written = await parent_serialize(
          [dataclasses.replace(p, value=a) for p, a in zip(batch, arrays)], serialization_context
      )
      del arrays
      await written


def leaf_handler_with_budget(max_inflight_bytes: int) -> type[LazyTensorLeafHandler]:
  """A handler class with its own budget: Orbax instantiates handler classes itself, with only a context."""
  if max_inflight_bytes == LazyTensorLeafHandler.max_inflight_bytes:
    return LazyTensorLeafHandler
  return type(
      LazyTensorLeafHandler.__name__,
      (LazyTensorLeafHandler,),
      {"max_inflight_bytes": int(max_inflight_bytes), "__module__": __name__},
  )


def add_lazy_tensor_leaf_handler(
    leaf_registry: Any, max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES
) -> Any:
  """Registers `LazyTensor` on `leaf_registry` so a v1 save writes it as `np.ndarray`, v0 and v1 readable."""
  leaf_registry.add(
      LazyTensor,
      _orbax_private.NumpyShapeDtype,
      leaf_handler_with_budget(max_inflight_bytes),
      override=True,
      secondary_typestrs=[NUMPY_TYPESTR],
  )
  return leaf_registry
