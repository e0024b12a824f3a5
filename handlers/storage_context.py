"""Tensorstore settings every Orbax save and restore in this process uses, whatever the storage."""

from __future__ import annotations

from typing import Any

from handlers import _orbax_private

# OCDBT's B-tree is copy-on-write: each commit (every block a save writes is one) writes new versions of the nodes
# on its path, and a cache pool keeps each new version decoded until the pool is full. Orbax gives that pool
# 100 MB (`cache_pool#ocdbt`), so a save's heap grew with every commit until the superseded versions filled it,
# and the heap fragmented around them. A save reads back only the nodes its next commit rewrites, which are a few
# small reads from the page cache, so it keeps none (docs/memory-and-streaming.md, "Flat to the last byte").
SAVE_BTREE_CACHE_BYTES = 0


def add_tensorstore_resources(resources: dict[str, Any]) -> None:
  """Adds context resources (e.g. `gcs_request_retries`, so that a storage outage fails a save in bounded time
  instead of tensorstore's default of about 15 minutes of retries) to every context Orbax opens arrays with, and
  limits the B-tree node cache as `SAVE_BTREE_CACHE_BYTES` says."""
  _orbax_private.add_to_default_ts_contexts(
      {"cache_pool#ocdbt": {"total_bytes_limit": SAVE_BTREE_CACHE_BYTES}, **resources})


def save_context() -> Any:
  """The tensorstore context Orbax builds for a save in this process (`tensorstore_utils.get_ts_context`)."""
  return _orbax_private.default_ts_context(use_ocdbt=True)
