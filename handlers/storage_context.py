"""Tensorstore settings every Orbax save and restore in this process uses, whatever the storage."""

from __future__ import annotations

from typing import Any

from handlers import _orbax_private

# OCDBT's B-tree is copy-on-write: each commit (every block a save writes is one) writes new versions of the nodes
# on its path, and a cache pool keeps each new version decoded until the pool is full. Orbax gives that pool
# 100 MB (`cache_pool#ocdbt`), so a save's heap grew with every commit until the superseded versions filled it,
# and the heap fragmented around them. A save to a local disk reads back only the nodes its next commit rewrites,
# a few small reads from the page cache, so it keeps none (docs/memory-and-streaming.md, "Flat to the last byte").
# A save to a bucket keeps Orbax's pool for now: without it, an emulated bucket stopped mid-save and restarted
# no longer listed its bucket (integration_tests/gcs_test.py, GcsOutageTest), not yet understood.
SAVE_BTREE_CACHE_BYTES = 0
ORBAX_BTREE_CACHE_BYTES = 100_000_000


def add_tensorstore_resources(resources: dict[str, Any], *, cache_btree_nodes: bool = False) -> None:
  """Adds context resources (e.g. `gcs_request_retries`, so that a storage outage fails a save in bounded time
  instead of tensorstore's default of about 15 minutes of retries) to every context Orbax opens arrays with, and
  sizes the B-tree node cache: `SAVE_BTREE_CACHE_BYTES`, or Orbax's own with `cache_btree_nodes`."""
  cache = ORBAX_BTREE_CACHE_BYTES if cache_btree_nodes else SAVE_BTREE_CACHE_BYTES
  _orbax_private.add_to_default_ts_contexts({"cache_pool#ocdbt": {"total_bytes_limit": cache}, **resources})


def save_context() -> Any:
  """The tensorstore context Orbax builds for a save in this process (`tensorstore_utils.get_ts_context`)."""
  return _orbax_private.default_ts_context(use_ocdbt=True)
