"""A PyTree checkpointable handler that accepts `LazyTensor` leaves."""

from __future__ import annotations

from typing import Any

import orbax.checkpoint as ocp

from handlers import _orbax_private
from handlers.leaf_handler import add_lazy_tensor_leaf_handler
from handlers.write_options import WriteOptions


class LazyTensorPyTreeHandler:
  """`ocp.v1.handlers.PyTreeHandler` with `LazyTensor` added to its leaf registry.

  A wrapper rather than a subclass: `PyTreeHandler` is `@typing.final`, and the checkpointables registry
  instantiates handler classes with no arguments, so the leaf registry has to be built in `__init__`.
  """

  write_options: WriteOptions = WriteOptions()

  def __init__(self, *, context: Any = None, leaf_handler_registry: Any = None):
    leaf_registry = leaf_handler_registry or _orbax_private.StandardLeafHandlerRegistry()
    add_lazy_tensor_leaf_handler(leaf_registry, self.write_options)
    self._leaf_registry = leaf_registry
    self._delegate = ocp.v1.handlers.PyTreeHandler(context=context, leaf_handler_registry=leaf_registry)

  @property
  def leaf_handler_registry(self) -> Any:
    return self._leaf_registry

  async def save(self, directory: Any, checkpointable: Any) -> Any:
    return await self._delegate.save(directory, checkpointable)

  async def load(self, directory: Any, abstract_checkpointable: Any = None) -> Any:
    return await self._delegate.load(directory, abstract_checkpointable)

  async def metadata(self, directory: Any) -> Any:
    return await self._delegate.metadata(directory)

  def is_handleable(self, checkpointable: Any) -> bool:
    return self._delegate.is_handleable(checkpointable)

  def is_abstract_handleable(self, abstract_checkpointable: Any) -> bool:
    return self._delegate.is_abstract_handleable(abstract_checkpointable)


def unhandled_leaves(tree: Any, leaf_registry: Any = None) -> list[str]:
  """"path: type" for every leaf no handler in `leaf_registry` (default: ours) can save.

  Orbax's own check reports only a set of types, and a v1 save that meets one fails with an error naming the
  checkpointable; checking first lets a caller name the leaf and stop before any background save starts.
  """
  import jax  # pylint: disable=g-import-not-at-top

  if leaf_registry is None:
    leaf_registry = add_lazy_tensor_leaf_handler(_orbax_private.StandardLeafHandlerRegistry())
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [
      f"{jax.tree_util.keystr(path)}: {type(leaf).__module__}.{type(leaf).__qualname__}"
      for path, leaf in flat
      if not leaf_registry.is_handleable(type(leaf))
  ]
