"""The output of a conversion to MaxText: everything under OUTPUT_DIR, from the lock to the commit.

One attempt, in order: the lock (primary process), the output prepared (an existing step refused or replaced, a
dead run's leftovers dropped unless kept for --resume), the resume journal opened and what earlier attempts wrote
salvaged, the save (converter/output/orbax_writer.py), then either the commit (Orbax's, once every process has
written its share) and the resume directory removed, or on failure the unfinished step parked for --resume
(lazy saves) or deleted: nothing is ever left that a loader takes for a checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses

from converter import storage
from converter.errors import ConversionError
from converter.options import RunContext, SaveOptions
from converter.checkpoint_format import layout
from converter.output import lock, orbax_writer, resume
from converter.output.destinations import destination_for
from converter.output.primary import all_then_on_primary, on_primary_then_all
from converter.checkpoint_format.record import ConversionRecord
from converter.planning.plan import Plan
from handlers.write_options import BlockWritten


@dataclasses.dataclass(frozen=True)
class Written:
  items_path: str  # What MaxText loads: OUTPUT_DIR/0/items.
  resumed_blocks: int  # Blocks an interrupted run had written, reused rather than recomputed.
  written_bytes: int  # Bytes of blocks this process wrote (its share, with several processes).


class MaxTextOutput:
  """OUTPUT_DIR of a conversion to MaxText, on a local disk or in a bucket."""

  def __init__(self, output_dir: str, run: RunContext):
    self.path = output_dir
    self._run = run
    self._destination = destination_for(output_dir)

  @property
  def step_path(self) -> str:
    return layout.step_path(self.path)

  def has_checkpoint(self) -> bool:
    return self._destination.has_committed_step()

  def write(self, plan: Plan, options: SaveOptions, record: ConversionRecord) -> Written:
    """Saves `plan` as step 0; with several processes every process calls this with the same arguments and
    writes its share."""
    primary = self._run.processes.is_primary
    try:
      with lock.hold(self._destination, on_lost=self._run.cancel) if primary else contextlib.nullcontext():
        return self._attempt(plan, options, record)
    finally:
      if self._run.early_reads is not None:
        self._run.early_reads.close()

  def _attempt(self, plan: Plan, options: SaveOptions, record: ConversionRecord) -> Written:
    run, processes = self._run, self._run.processes
    on_primary_then_all(processes, "output prepared", lambda: self._prepare(keep_unfinished=options.lazy))
    salvage, journal = (resume.prepare(self._destination, plan, resume=run.resume, processes=processes)
                        if options.lazy else (None, None))
    if run.progress is not None:
      run.progress.start(plan.total_bytes)
    listeners = [c for c in (run.progress, journal) if c is not None]
    written = [0]

    def block_written(event: BlockWritten) -> None:
      written[0] += event.nbytes
      for listener in listeners:
        listener(event)

    try:
      items_path = orbax_writer.save(
          resume.with_salvage(plan, salvage) if salvage else plan, self._destination, options,
          custom_metadata=record.custom_metadata(), on_block_written=block_written, cancel=run.cancel,
          processes=processes, early_reads=None if salvage and salvage.blocks else run.early_reads)
    except BaseException as e:
      # A lazy save's work is parked for --resume; an eager one's is never a loadable checkpoint: dropped.
      kept = journal is not None and resume.park(self._destination, journal)
      if journal is None and processes.is_primary:
        self._remove_unfinished()
      if not isinstance(e, ConversionError):
        raise
      if kept:
        raise ConversionError(f"{e}; nothing was committed, and what was written is kept: rerun with --resume"
                              " to continue") from e
      raise ConversionError(f"{e}; nothing was committed") from e

    def drop_salvage() -> None:
      if journal is not None:
        resume.finish(self.path)

    if journal is not None:
      journal.close()
    # Orbax's primary commits last; nobody reads the output, nor are the salvaged blocks dropped, before every
    # process is here.
    all_then_on_primary(processes, "committed", drop_salvage)
    return Written(items_path, salvage.reused.count if salvage else 0, written[0])

  def _prepare(self, *, keep_unfinished: bool) -> None:
    """Refuses (or with --overwrite removes) an existing step; drops a dead run's leftovers unless kept for
    --resume."""
    storage.make_dirs(self.path)
    if self._destination.has_committed_step():
      if not self._run.overwrite:
        raise ConversionError(f"{self.step_path}: a checkpoint already exists here; pass --overwrite to replace it")
      storage.remove_tree(self.step_path)
    if not keep_unfinished:
      self._remove_unfinished()
    self._destination.check_writable()

  def _remove_unfinished(self) -> None:
    for path in self._destination.unfinished_steps():
      storage.remove_tree(path)
