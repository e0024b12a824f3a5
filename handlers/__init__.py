"""Orbax handlers for lazily loaded tensors: save them through the v1 API, restore them as numpy anywhere.

Importing the package is cheap: the first name taken from it (`from handlers import LazyTensor`) loads the whole
API, Orbax and JAX with it, and registers the v0 type handler. Its light modules (`handlers.lazy_tensor`,
`handlers.blocks`, `handlers.write_options`, `handlers.shares`, `handlers.claims`) import alone, for what runs
before JAX and Orbax have loaded.
"""

import importlib
import importlib.util
from typing import Any


def __getattr__(name: str) -> Any:
  if name.startswith("__"):  # Asked by tools that probe modules (`__wrapped__`, `__all__`): not a reason to load.
    raise AttributeError(f"module 'handlers' has no attribute {name!r}")
  if importlib.util.find_spec(f"{__name__}.{name}") is not None:  # A submodule (`from handlers import shares`).
    return importlib.import_module(f"{__name__}.{name}")
  api = importlib.import_module("handlers._api")
  if name not in api.__all__:
    raise AttributeError(f"module 'handlers' has no attribute {name!r}")
  return getattr(api, name)


def __dir__() -> list[str]:
  return sorted(importlib.import_module("handlers._api").__all__)
