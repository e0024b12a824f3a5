"""`LazyTensor` support for Orbax v0 callers (`PyTreeCheckpointer`, v0 `CheckpointManager`).

A v1 save never consults this registry; it exists so code still on the v0 API can save the same trees.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from handlers.lazy_tensor import LazyTensor


class LazyTensorV0Handler(ocp.type_handlers.NumpyHandler):
  """v0 numpy handler that materialises LazyTensors first; records "np.ndarray" as the type."""

  async def serialize(self, values: Sequence[Any], infos: Sequence[Any], args: Sequence[Any] | None = None):
    arrays = [np.asarray(v) for v in values]
    return await super().serialize(arrays, infos, args)


def register_v0_type_handler() -> None:
  # Orbax warns that the typestr "np.ndarray" is shared with the numpy handler; sharing it is the point (v0
  # readers restore LazyTensor leaves as numpy), so the warning is silenced for this one call.
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)
  try:
    ocp.type_handlers.register_type_handler(LazyTensor, LazyTensorV0Handler(), override=True)
  finally:
    logging.set_verbosity(verbosity)
