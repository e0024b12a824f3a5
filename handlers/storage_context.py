"""Tensorstore settings every Orbax save and restore in this process uses, whatever the storage."""

from __future__ import annotations

from typing import Any

from handlers import _orbax_private

# OCDBT's B-tree is copy-on-write: each commit (every block a save writes is one) writes new versions of the nodes
# on its path, and a cache pool keeps each new version decoded until the pool is full. Orbax gives that pool
# 100 MB (`cache_pool#ocdbt`), so a save's heap grew with every commit until the superseded versions filled it,
# and the heap fragmented around them. A save to a local disk reads back only the nodes its next commit rewrites,
# a few small reads from the page cache, so it keeps none (docs/memory-and-streaming.md, "Flat to the last byte").
# A save to a bucket keeps Orbax's pool for now. It was kept because gcs_test's outage case (the emulator stopped
# mid-save, restarted) failed twice without it, its restarted emulator answering 404 for its bucket; the same 404
# has since come with the pool kept (a CI run), so the pool was not its cause: dropping it for buckets too is
# still to be measured.
SAVE_BTREE_CACHE_BYTES = 0
ORBAX_BTREE_CACHE_BYTES = 100_000_000
# The same copy-on-write rewrites each commit's path through the tree, and Orbax lets a node grow to 100 MB
# decoded: a process's whole index was one leaf, rewritten whole at every commit (a whole DeepSeek-V3, 1.3 TB of
# zeros, left 14 GB of superseded leaves beside almost no data), its decoded copy growing with the bytes written.
# Capped, a commit rewrites a leaf of at most this size and the nodes above it. Only the per-process databases are
# capped: the checkpoint's own, which readers traverse, is written once when Orbax merges them and keeps Orbax's.
SAVE_BTREE_NODE_BYTES = 16 << 10


def configure_saves(resources: dict[str, Any], *, cache_btree_nodes: bool = False) -> None:
  """Sets what every save from this process uses from now on: context resources (e.g. `gcs_request_retries`, so
  that a storage outage fails a save in bounded time instead of tensorstore's default of about 15 minutes of
  retries) added to every context Orbax opens arrays with; the B-tree node cache, `SAVE_BTREE_CACHE_BYTES` or
  Orbax's own with `cache_btree_nodes`; and the B-tree nodes of each process's database, `SAVE_BTREE_NODE_BYTES`."""
  cache = ORBAX_BTREE_CACHE_BYTES if cache_btree_nodes else SAVE_BTREE_CACHE_BYTES
  _orbax_private.add_to_default_ts_contexts({"cache_pool#ocdbt": {"total_bytes_limit": cache}, **resources})
  _orbax_private.configure_process_btree_nodes(SAVE_BTREE_NODE_BYTES)


def save_context() -> Any:
  """The tensorstore context Orbax builds for a save in this process (`tensorstore_utils.get_ts_context`)."""
  return _orbax_private.default_ts_context(use_ocdbt=True)
