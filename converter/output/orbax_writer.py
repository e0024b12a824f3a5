"""Writes a plan as step 0 of an Orbax checkpoint through the v1 API, with errors that name the leaf.

What happens around the save (the output prepared, the journal, cleaning up or parking on failure, the commit's
barriers) is the output's (converter/output/maxtext.py); this module only saves.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping

import orbax.checkpoint as ocp
from absl import logging

from converter import processes as processes_lib
from converter import storage
from converter.errors import ConversionError
from converter.planning.lazy_leaves import lazy_tree
from converter.options import SaveOptions
from converter.checkpoint_format import layout
from converter.output.destination import Destination
from converter.planning.plan import Plan
from handlers import (
    ITEMS,
    BlockWritten,
    LazyTensorLoadError,
    LazyTensorWriteError,
    Processes,
    SaveCancelled,
    WriteOptions,
    configure_saves,
    brief_error,
    lazy_tensor_context,
    unhandled_leaves,
)
from handlers.early_reads import EarlyReads


_SIGNAL_POLL_S = 0.1


def _wait_for_signals(response: Any) -> None:
  """`response.result()`, waking every _SIGNAL_POLL_S so that a SIGINT's handler runs while the save goes on.

  Python runs signal handlers on the main thread only, when it next executes bytecode; the kernel may deliver the
  signal to any of the save's threads, and a main thread blocked in one long wait then ran the handler (which
  cancels the save) only once the whole checkpoint was committed: interrupted, yet complete and exit 0. The wait
  itself runs on a thread of its own, so that no error the save raised is taken for the poll's own timeout:
  polling `result(timeout=...)` read a save that had failed with TimeoutError as one still running, and raised
  that same error again at every poll, its traceback growing by a few frames each time (18 GB in ten minutes).
  """
  failed: list[BaseException] = []

  def wait() -> None:
    try:
      response.result()
    except BaseException as e:  # pylint: disable=broad-except  # Raised below, on the caller's thread.
      failed.append(e)

  waiter = threading.Thread(target=wait, name="hf2maxtext-save-wait", daemon=True)
  waiter.start()
  while waiter.is_alive():
    waiter.join(_SIGNAL_POLL_S)
  if failed:
    raise failed[0]


def save(
    plan: Plan,
    destination: Destination,
    options: SaveOptions,
    *,
    custom_metadata: Mapping[str, Any],
    on_block_written: Callable[[BlockWritten], None] | None = None,
    cancel: threading.Event | None = None,
    processes: Processes = Processes(),
    early_reads: EarlyReads | None = None,
) -> str:
  """Saves `plan` as step 0 of the destination; returns the items path MaxText loads. Raises ConversionError
  naming the output (and the leaf, where one failed); what a failed save leaves is the caller's to clean up."""
  output_dir = destination.path
  try:
    tree = lazy_tree(plan, lazy=options.lazy, devices=options.devices, processes=processes)
    unhandled = unhandled_leaves(tree)
    if unhandled:
      raise ConversionError(f"{output_dir}: no Orbax leaf handler for: {'; '.join(unhandled[:5])}")
    configure_saves(storage.tensorstore_resources(), cache_btree_nodes=storage.is_remote(output_dir))
    write_options = WriteOptions(max_inflight_bytes=options.max_inflight_bytes, on_block_written=on_block_written,
                                 cancel=cancel, processes=processes, claims=processes_lib.claims(processes),
                                 compression=options.compression, zstd_level=options.zstd_level or plan.zstd_level,
                                 checksums=options.checksums,
                                 early_reads=early_reads)
    checkpointer = ocp.v1.training.Checkpointer(storage.epath_of(output_dir),
                                                context=lazy_tensor_context(write_options))
    try:
      with destination.writing():
        response = checkpointer.save_checkpointables_async(layout.STEP, {ITEMS: tree},
                                                           custom_metadata=dict(custom_metadata))
        if response is None:
          raise ConversionError(f"{output_dir}: Orbax's save policy skipped step {layout.STEP}")
        _wait_for_signals(response)
    finally:
      checkpointer.close()
    if cancel is not None and cancel.is_set():
      logging.warning("%s: asked to stop after the last block was written; the checkpoint is complete and"
                      " committed", output_dir)
  except (ConversionError, KeyboardInterrupt, SystemExit):
    raise
  except BaseException as e:
    logging.vlog(1, "save failed", exc_info=True)
    if isinstance(e, SaveCancelled) or (cancel is not None and cancel.is_set()):
      raise ConversionError(f"{output_dir}: interrupted") from e
    if isinstance(e, (LazyTensorLoadError, LazyTensorWriteError)):
      raise ConversionError(f"{output_dir}: {e}") from e
    raise ConversionError(
        f"{output_dir}: writing the checkpoint failed ({brief_error(e)}) (run with -v=1 for the full traceback)"
    ) from e
  return layout.items_path(output_dir)
