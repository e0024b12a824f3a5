"""Resuming an interrupted conversion from the blocks it had already written durably.

Every save keeps a journal of the blocks whose writes have completed (tensorstore reports a write done once
OCDBT has committed it to disk), next to a fingerprint of the inputs and the plan:

  OUT/0.hf2maxtext-resume/fingerprint.json
  OUT/0.hf2maxtext-resume/gen-N.journal     one JSON line per written block: {"a": array name, "s": start, "e": stop}
                                            and, written in restoring hosts' parts, "p": [[start, stop, database]]
  OUT/0.hf2maxtext-resume/gen-N/            attempt N's Orbax temporary directory, moved here after it died

A killed save never commits, so what it leaves (`OUT/0.orbax-checkpoint-tmp` on a local disk, an `OUT/0` without
`commit_success.txt` in a bucket: the destination's `unfinished_steps`) is nothing a loader takes for a checkpoint.
`--resume` moves it into the resume directory as the generation its journal names, then runs a fresh save in
which every journaled block is copied from the newest generation holding it instead of being read and
transformed again: the result is byte-for-byte the checkpoint an uninterrupted run writes. Generations nothing
refers to any more are deleted. In a bucket, where objects cannot be appended to, a journal is a series of small
objects (`gen-N.journal.000000`, ...), one per half second of written blocks (the journals are the
destination's: converter/output/local.py, bucket.py); the move is a server-side copy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import threading
from typing import Any, Callable

import numpy as np
import tensorstore as ts
from absl import logging

from converter import storage
from converter.arrays import Shape
from converter.errors import ConversionError
from converter.planning.loader import Loader
from converter.checkpoint_format import layout as orbax_layout
from converter.output.destination import Destination, Journal
from converter.output.primary import on_primary_then_all
from converter.planning.plan import Plan
from converter.sources import SourceTensor
from converter.storage import hub
from handlers.shares import Processes

RESUME_DIR = f"{orbax_layout.STEP}.hf2maxtext-resume"
# gen-N.journal (one process), gen-N.process-I.journal (process I of several); .NNNNNN parts in buckets.
_JOURNAL = re.compile(r"gen-(\d+)(?:\.process-(\d+))?\.journal(\.\d+)?$")


def resume_dir(output_dir: str) -> str:
  return storage.join(output_dir, RESUME_DIR)


def fingerprint(plan: Plan) -> dict[str, Any]:
  """What must not change between an interrupted run and its resumption."""
  files = sorted({f for leaf in plan.leaves for t in leaf.loader.source_tensors() for f in t.files})
  return {
      "inputs": [[f, storage.size(f), storage.version(f)] for f in files],
      "plan": hashlib.sha256(json.dumps(
          [[leaf.name, list(leaf.shape), leaf.dtype.name, list(leaf.sources)] for leaf in plan.leaves]
      ).encode()).hexdigest(),
      "target_model": plan.target_model,
  }


def _moved_revision(recorded: dict[str, Any], current: dict[str, Any]) -> str | None:
  """What to say when the interrupted run read a Hub repo at another commit than its revision names now."""
  commits = lambda fingerprint: {(f.repo_id, f.revision) for f in
                                 (hub.parse(i[0]) for i in fingerprint.get("inputs", []) if hub.is_hub(i[0]))}
  before, now = commits(recorded), commits(current)
  if not before or before == now:
    return None
  repo, commit = sorted(before)[0]
  return (f" ({repo} was read at commit {commit}, and the revision now names"
          f" {', '.join(sorted(c for r, c in now if r == repo)) or 'another'}): pass --revision={commit} with"
          " --resume to finish it, or rerun without --resume")


Block = tuple[tuple[int, ...], tuple[int, ...]]  # (start, stop) of a region.


def _journals(directory: str) -> dict[int, dict[int, list[str]]]:
  """Each generation's journal files (local) or parts (bucket), by generation, then by the process that wrote
  them (the blocks are in that process's OCDBT database)."""
  found: dict[int, dict[int, list[str]]] = {}
  for name in storage.list_names(directory):
    match = _JOURNAL.match(name)
    if match:
      process = int(match.group(2) or 0)
      found.setdefault(int(match.group(1)), {}).setdefault(process, []).append(storage.join(directory, name))
  return {generation: {p: sorted(paths) for p, paths in sorted(by_process.items())}
          for generation, by_process in sorted(found.items())}


Pieces = tuple[tuple[Block, str], ...]  # A block's pieces, each in its own database (`BlockWritten.pieces`).


def _load_journal(paths: list[str]) -> list[tuple[str, Block, Pieces]]:
  entries = []
  for path in paths:
    for line in storage.read_text(path).splitlines(keepends=True):
      try:
        entry = json.loads(line)
        pieces = tuple(((tuple(s), tuple(e)), str(d)) for s, e, d in entry.get("p", ()))
        entries.append((entry["a"], (tuple(entry["s"]), tuple(entry["e"])), pieces))
      except (ValueError, RecursionError, KeyError, TypeError):
        break  # A torn last line: everything before it stands.
  return entries


def _data_root(generation_dir: str, database: int | str) -> str | None:
  """Where process `database` of the generation wrote its arrays, or the pieces of restoring hosts' parts named
  `database` (`handlers.host_databases.database_name`): that OCDBT database (never merged: the save never
  finished)."""
  for name in storage.list_names(generation_dir):
    if name.startswith(orbax_layout.ITEMS):
      root = orbax_layout.process_database(storage.join(generation_dir, name), database)
      if storage.exists(root):
        return root
  return None


@dataclasses.dataclass(frozen=True)
class Salvaged:
  """Where a salvaged block lies: an OCDBT database, and the one holding the arrays' metadata (the primary
  process's: with several processes only it creates the arrays)."""

  root: str
  metadata_root: str
  pieces: tuple[tuple[Block, str], ...] = ()  # Written in pieces: each piece's region and root (`root` unused).


class ReusedBlocks:
  """How many salvaged blocks this process's save actually took instead of recomputing them (a block the journal
  lists but the database lost, or one the resumed run cuts otherwise, is not one). Pickled, it starts again."""

  def __init__(self):
    self._lock = threading.Lock()
    self.count = 0

  def add(self) -> None:
    with self._lock:
      self.count += 1

  def __reduce__(self):
    return ReusedBlocks, ()


@dataclasses.dataclass(frozen=True)
class Salvage:
  """Blocks already written by earlier attempts: (array name, block) -> where they lie; `reused` counts those a
  save took."""

  blocks: dict[tuple[str, Block], Salvaged]
  reused: ReusedBlocks = dataclasses.field(default_factory=ReusedBlocks, compare=False)

  def for_array(self, array_name: str) -> dict[Block, Salvaged]:
    return {block: where for (name, block), where in self.blocks.items() if name == array_name}


def journal_path(output_dir: str, generation: int, processes: Processes) -> str:
  process = "" if processes.count == 1 else f".process-{processes.index}"
  return storage.join(resume_dir(output_dir), f"gen-{generation}{process}.journal")


def prepare(destination: Destination, plan: Plan, *, resume: bool,
            processes: Processes = Processes()) -> tuple[Salvage, Journal]:
  """Sets up this attempt's journal; with `resume`, collects what earlier attempts wrote.

  With several processes every process checks the fingerprint and reads every journal (each may salvage blocks
  any process wrote), but only the primary moves and deletes, before a barrier.
  """
  directory = resume_dir(destination.path)
  current = fingerprint(plan)
  fingerprint_path = storage.join(directory, "fingerprint.json")
  resuming = resume and storage.is_file(fingerprint_path)
  if resuming:
    recorded = json.loads(storage.read_text(fingerprint_path))
    if recorded != current:
      raise ConversionError(
          f"{directory}: cannot resume: the inputs or the plan changed since the interrupted run"
          + (_moved_revision(recorded, current) or " (different files, sizes, modification times, flags or target);"
             " rerun without --resume"))
  on_primary_then_all(processes, "resume directory prepared",
                      lambda: _prepare_directory(destination, current, resuming=resuming, warn=resume and not resuming))
  salvage, generation = _salvage(directory) if resuming else ({}, 0)
  return Salvage(salvage), destination.journal(journal_path(destination.path, generation, processes))


def _prepare_directory(destination: Destination, current: dict[str, Any], *, resuming: bool, warn: bool) -> None:
  """Resuming: parks the dead run's unfinished step as the generation its journals name and deletes the
  generations nothing refers to; otherwise starts an empty resume directory with the fingerprint."""
  directory = resume_dir(destination.path)
  stale = destination.unfinished_steps()
  if resuming:
    journals = _journals(directory)
    if journals and stale:
      parked = storage.join(directory, f"gen-{max(journals)}")
      if storage.exists(parked):
        # The dead run parked its work, and one of Orbax's threads then wrote a little more into a new
        # temporary directory after the journal was closed: nothing journaled refers to it.
        storage.remove_tree(stale[0])
      else:
        storage.move(stale[0], parked)
    for leftover in stale[1:]:
      storage.remove_tree(leftover)
    salvage, _ = _salvage(directory)
    referenced = {root for where in salvage.values() for root in (where.root, *(r for _, r in where.pieces))}
    for number, by_process in journals.items():
      generation_dir = storage.join(directory, f"gen-{number}")
      if not any(root.startswith(generation_dir + "/") for root in referenced):
        storage.remove_tree(generation_dir)
    return
  if warn:
    logging.warning("%s has nothing to resume; converting from the start", directory)
  storage.remove_tree(directory)
  for path in stale:
    storage.remove_tree(path)
  storage.make_dirs(directory)
  storage.write_text(storage.join(directory, "fingerprint.json"), json.dumps(current))


def _salvage(directory: str) -> tuple[dict[tuple[str, Block], Salvaged], int]:
  """Every journaled block and where it lies (newer generations override older ones); the next generation."""
  journals = _journals(directory)
  salvage: dict[tuple[str, Block], Salvaged] = {}
  for number, by_process in journals.items():
    generation_dir = storage.join(directory, f"gen-{number}")
    metadata_root = _data_root(generation_dir, 0)
    if metadata_root is None:
      continue
    for process, paths in by_process.items():
      root = _data_root(generation_dir, process)
      if root is None:
        continue
      databases: dict[str, str | None] = {}  # Each found once: a bucket lists and stats for every lookup.
      for array_name, block, pieces in _load_journal(paths):
        for _, database in pieces:
          if database not in databases:
            databases[database] = _data_root(generation_dir, database)
        piece_roots = tuple((piece, databases[database]) for piece, database in pieces)
        if all(piece_root is not None for _, piece_root in piece_roots):
          salvage[array_name, block] = Salvaged(root, metadata_root, piece_roots)
  return salvage, (max(journals) + 1 if journals else 0)


def with_salvage(plan: Plan, salvage: Salvage) -> Plan:
  """`plan` with every leaf that has salvaged blocks reading them from disk instead of recomputing them."""
  if not salvage.blocks:
    return plan
  leaves = []
  for leaf in plan.leaves:
    name = ".".join(("params", "params", *leaf.path))
    blocks = salvage.for_array(name)
    leaves.append(dataclasses.replace(leaf, loader=SalvagingLoader(leaf.loader, name, blocks, salvage.reused))
                  if blocks else leaf)
  return dataclasses.replace(plan, leaves=tuple(leaves))


def park(destination: Destination, journal: Journal) -> bool:
  """After a failed save: moves what Orbax left unfinished into the resume directory; True if anything is kept.

  Best effort, since the save may have failed because the storage did: journal entries that cannot be written
  only mean their blocks are redone, and an unfinished step that cannot be moved now is moved by `prepare` on
  the next --resume.
  """
  try:
    journal.close()
  except ConversionError as e:
    # The storage is failing: moving the unfinished step now would only spend another round of retries.
    logging.warning("resume journal: the last entries were not written (%s); their blocks will be redone, and"
                    " what was written stays where it is for --resume", e)
    return True
  try:
    stale = destination.unfinished_steps()
    if not stale:
      return False
    if _JOURNAL.match(storage.basename(journal.path)).group(2) is not None:
      return True  # Several processes: others may still be writing there; --resume's primary parks it.
    storage.move(stale[0],
                 storage.join(resume_dir(destination.path), storage.basename(journal.path)[: -len(".journal")]))
  except ConversionError as e:
    logging.warning("%s: what was written stays where it is for --resume (%s)", destination.path, e)
  return True


def finish(output_dir: str) -> None:
  """After the commit (and every process's last salvaged read): nothing is left to resume."""
  storage.remove_tree(resume_dir(output_dir))


_stores: dict[tuple[str, str], Any] = {}
_stores_lock = threading.Lock()


def _open_salvaged(where: Salvaged, array_name: str) -> Any:
  key = (where.root, array_name)
  with _stores_lock:
    if key not in _stores:
      context = ts.Context(storage.tensorstore_resources())
      spec = lambda root: {"driver": "zarr3", "kvstore": {
          "driver": "ocdbt", "base": f"{orbax_layout.kvstore_base(root)}/", "path": f"{array_name}/"}}
      if where.root == where.metadata_root:
        _stores[key] = ts.open(spec(where.root), open=True, read=True, context=context).result()
      else:  # Only the primary's database holds the array's metadata.
        metadata = ts.open(spec(where.metadata_root), open=True, read=True, context=context).result().spec()
        _stores[key] = ts.open(dict(spec(where.root), metadata=metadata.to_json()["metadata"]), open=True,
                               read=True, assume_metadata=True, context=context).result()
    return _stores[key]


@dataclasses.dataclass(frozen=True)
class SalvagingLoader:
  """A leaf loader that returns blocks an earlier attempt wrote, and asks `inner` for the rest.

  Only a region that is exactly a journaled block is copied (a resumed run with another budget may cut the
  leaf into other blocks; those are recomputed).
  """

  inner: Loader
  array_name: str
  salvaged: dict[Block, Salvaged]
  reused: ReusedBlocks = dataclasses.field(default_factory=ReusedBlocks, compare=False)

  @property
  def shape(self) -> Shape:
    return self.inner.shape

  @property
  def dtype(self) -> np.dtype:
    return self.inner.dtype

  @property
  def block_shape(self) -> Shape:
    return self.inner.block_shape

  def source_tensors(self) -> tuple[SourceTensor, ...]:
    return self.inner.source_tensors()

  def map_reads(self, read: Callable[[Loader], Loader]) -> Loader:
    return dataclasses.replace(self, inner=self.inner.map_reads(read))

  def __call__(self) -> np.ndarray:
    return self.inner()

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    where = self.salvaged.get((tuple(s.start for s in index), tuple(s.stop for s in index)))
    if where is not None:
      try:
        if not where.pieces:
          out = np.asarray(_open_salvaged(where, self.array_name)[index].read().result())
        else:
          out = np.empty(tuple(s.stop - s.start for s in index), self.dtype)
          for (start, stop), root in where.pieces:
            within = tuple(slice(a - s.start, b - s.start) for a, b, s in zip(start, stop, index))
            piece = _open_salvaged(dataclasses.replace(where, root=root), self.array_name)
            out[within] = piece[tuple(slice(a, b) for a, b in zip(start, stop))].read().result()
        self.reused.add()
        return out
      except Exception:  # A block the journal lists but the database lost: recompute it.
        pass
    return self.inner.region(index)
