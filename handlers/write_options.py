"""How the streaming handlers write: the byte budget, and who hears about each block written."""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Callable

from handlers.shares import Processes

if TYPE_CHECKING:
  from handlers.claims import Claims
  from handlers.early_reads import EarlyReads

DEFAULT_MAX_INFLIGHT_BYTES = 128 << 20


@dataclasses.dataclass(frozen=True)
class BlockWritten:
  """One block is durably in the stored array `array_name` (Orbax's leaf name, e.g. "params.params.x")."""

  array_name: str
  start: tuple[int, ...]
  stop: tuple[int, ...]
  nbytes: int
  # Where the block's pieces lie when each restoring host's part went to an OCDBT database of its own
  # (handlers/host_databases.py): (start, stop, database) each, the database `ocdbt.process_<database>` until the
  # save's commit merges them; empty: the block is whole in the writing process's database.
  pieces: tuple[tuple[tuple[int, ...], tuple[int, ...], str], ...] = ()


@dataclasses.dataclass(frozen=True)
class WriteOptions:
  max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES
  # Called on the save's event loop after each block's write has completed (progress bars, resume journals).
  on_block_written: Callable[[BlockWritten], None] | None = None
  # Set it (from a signal handler, say) to stop before the next block: the save then fails and never commits.
  cancel: threading.Event | None = None
  processes: Processes = Processes()
  # With several processes, how they agree on who writes which unit of work once the first have finished their
  # own shares (handlers/claims.py); None: each writes exactly its own share.
  claims: Claims | None = None
  # zstd (Orbax's default for zarr3, level 3), or no compression: larger files, no compressor on the critical
  # path (Orbax's own ArrayOptions.Saving.use_compression; every reader, MaxText's included, reads both).
  compression: bool = True
  # zstd's level for compressed chunks (Orbax writes zarr3 at 3, zarr2 at 1); every level reads back the same way.
  # The converter chooses it per plan (converter/planning/plan.py `default_zstd_level`).
  zstd_level: int = 1
  # A checksum on every stored chunk (zstd's content checksum, or a crc32c codec when uncompressed), which
  # tensorstore checks on every read (Orbax v0 and v1, MaxText's loader): a damaged byte fails the restore instead
  # of restoring wrong values. Off only to write what earlier versions wrote (comparisons).
  checksums: bool = True
  # The save's first blocks, read while the save was being set up (handlers/early_reads.py): taken, not re-read.
  early_reads: EarlyReads | None = None


class SaveCancelled(RuntimeError):
  """The save was stopped through `WriteOptions.cancel`."""


def configured(cls: type, options: WriteOptions) -> type:
  """`cls` with `options` baked in: Orbax instantiates handler classes itself, passing only a context."""
  if options == cls.write_options:
    return cls
  return type(cls.__name__, (cls,), {"write_options": options, "__module__": cls.__module__})
