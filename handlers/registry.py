"""The checkpointables registry a converter passes to an Orbax v1 save."""

from __future__ import annotations

from typing import Any

import orbax.checkpoint as ocp

from handlers.leaf_handler import DEFAULT_MAX_INFLIGHT_BYTES
from handlers.tree_handler import tree_handler_with_budget

ITEMS = "items"


def build_lazy_tensor_checkpointables_registry(
    checkpointable_name: str = ITEMS, max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES
) -> Any:
  """A local registry (global handlers included) binding the LazyTensor tree handler to `checkpointable_name`.

  A v1 save looks up the handler for a checkpointable by name first, so trees saved as "items" (MaxText's
  name) reach our tree handler even though the global registry's PyTreeHandler would reject their leaves.
  """
  registry = ocp.v1.handlers.local_registry(include_global_registry=True)
  registry.add(tree_handler_with_budget(max_inflight_bytes), checkpointable_name=checkpointable_name)
  return registry


def lazy_tensor_context(max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES) -> Any:
  """An `ocp.v1.Context` whose checkpointables registry knows `LazyTensor` under "items"."""
  context = ocp.v1.Context()
  context.checkpointables.registry = build_lazy_tensor_checkpointables_registry(
      max_inflight_bytes=max_inflight_bytes
  )
  return context
