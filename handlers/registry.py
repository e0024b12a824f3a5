"""The checkpointables registry a converter passes to an Orbax v1 save."""

from __future__ import annotations

from typing import Any

import orbax.checkpoint as ocp

from handlers import _orbax_private
from handlers.tree_handler import LazyTensorPyTreeHandler
from handlers.write_options import WriteOptions, configured

ITEMS = "items"


def build_lazy_tensor_checkpointables_registry(
    checkpointable_name: str = ITEMS, options: WriteOptions = WriteOptions()
) -> Any:
  """A local registry (global handlers included) binding the LazyTensor tree handler to `checkpointable_name`.

  A v1 save looks up the handler for a checkpointable by name first, so trees saved as "items" (MaxText's
  name) reach our tree handler even though the global registry's PyTreeHandler would reject their leaves.
  """
  registry = ocp.v1.handlers.local_registry(include_global_registry=True)
  registry.add(configured(LazyTensorPyTreeHandler, options), checkpointable_name=checkpointable_name)
  return registry


# Orbax fails a save still running after `AsyncOptions.timeout_secs`, 20 minutes by default: a whole DeepSeek-V3
# (1.3 TB written) takes longer than that on most hosts. A save here ends when its bytes are written; a stalled
# bucket fails its requests within the retry policy (converter/storage), and a lost writer's lease ends the run.
SAVE_TIMEOUT_S = 30 * 24 * 3600


def lazy_tensor_context(options: WriteOptions = WriteOptions()) -> Any:
  """An `ocp.v1.Context` whose checkpointables registry knows `LazyTensor` under "items".

  Options are set on the context's own option objects (Orbax's dot-notation configuration): passing option
  objects to `Context(...)` is deprecated since orbax-checkpoint 0.12.8 and logs a warning on every run. They
  must be set before the context is entered (`with context:` freezes them). zstd's level and whether stored chunks
  carry checksums have no Orbax option: they are set for the process, for the saves made from now on.
  """
  context = ocp.v1.Context()
  context.asynchronous.timeout_secs = SAVE_TIMEOUT_S
  context.array.saving.use_compression = options.compression
  _orbax_private.configure_chunks(checksums=options.checksums, zstd_level=options.zstd_level)
  context.checkpointables.registry = build_lazy_tensor_checkpointables_registry(options=options)
  return context
