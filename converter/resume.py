"""Resuming an interrupted conversion from the blocks it had already written durably.

Every save keeps a journal of the blocks whose writes have completed (tensorstore reports a write done once
OCDBT has committed it to disk), next to a fingerprint of the inputs and the plan:

  OUT/0.hf2maxtext-resume/fingerprint.json
  OUT/0.hf2maxtext-resume/gen-N.journal     one JSON line per written block: {"a": array name, "s": start, "e": stop}
  OUT/0.hf2maxtext-resume/gen-N/            attempt N's Orbax temporary directory, moved here after it died

A killed save never commits (Orbax renames its temporary directory only when everything is written), so what
it leaves is `OUT/0.orbax-checkpoint-tmp`, which nothing loads as a checkpoint. `--resume` moves it into the
resume directory as the generation its journal names, then runs a fresh save in which every journaled block
is copied from the newest generation holding it instead of being read and transformed again: the result is
byte-for-byte the checkpoint an uninterrupted run writes. Generations nothing refers to any more are deleted.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import shutil
import threading
import time
from typing import Any

import numpy as np
import tensorstore as ts
from absl import logging

from converter.errors import ConversionError
from converter.plan import Plan, source_tensors
from converter.writer import STEP, unfinished_dir
from handlers import BlockWritten

RESUME_DIR = f"{STEP}.hf2maxtext-resume"
_FSYNC_INTERVAL_S = 0.5


def resume_dir(output_dir: str) -> str:
  return os.path.join(output_dir, RESUME_DIR)


def fingerprint(plan: Plan) -> dict[str, Any]:
  """What must not change between an interrupted run and its resumption."""
  files = sorted({f for leaf in plan.leaves for t in source_tensors(leaf.loader) for f in t.files})
  return {
      "inputs": [[f, os.path.getsize(f), os.stat(f).st_mtime_ns] for f in files],
      "plan": hashlib.sha256(json.dumps(
          [[leaf.name, list(leaf.shape), leaf.dtype.name, list(leaf.sources)] for leaf in plan.leaves]
      ).encode()).hexdigest(),
      "target_model": plan.target_model,
  }


class Journal:
  """Appends written blocks to gen-N.journal; fsyncs at most every half second (a lost tail is redone)."""

  def __init__(self, path: str):
    self.path = path
    self._file = open(path, "a", encoding="utf-8")
    self._lock = threading.Lock()
    self._last_sync = time.monotonic()

  def __call__(self, event: BlockWritten) -> None:
    with self._lock:
      self._file.write(json.dumps({"a": event.array_name, "s": list(event.start), "e": list(event.stop)}) + "\n")
      self._file.flush()
      now = time.monotonic()
      if now - self._last_sync >= _FSYNC_INTERVAL_S:
        os.fsync(self._file.fileno())
        self._last_sync = now

  def close(self) -> None:
    with self._lock:
      if not self._file.closed:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()


def _generation(path: str) -> int:
  return int(os.path.basename(path).split("-")[1].split(".")[0])


Block = tuple[tuple[int, ...], tuple[int, ...]]  # (start, stop) of a region.


def _load_journal(path: str) -> list[tuple[str, Block]]:
  entries = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        entry = json.loads(line)
        entries.append((entry["a"], (tuple(entry["s"]), tuple(entry["e"]))))
      except (json.JSONDecodeError, KeyError, TypeError):
        break  # A torn last line: everything before it stands.
  return entries


def _data_root(generation_dir: str) -> str | None:
  """Where the generation's arrays live: its per-process OCDBT database (never merged: it never finished)."""
  found = sorted(glob.glob(os.path.join(generation_dir, "items*", "ocdbt.process_0")))
  return found[0] if found else None


@dataclasses.dataclass(frozen=True)
class Salvage:
  """Blocks already written by earlier attempts: (array name, block) -> that generation's OCDBT root."""

  blocks: dict[tuple[str, Block], str]

  def for_array(self, array_name: str) -> dict[Block, str]:
    return {block: root for (name, block), root in self.blocks.items() if name == array_name}


def prepare(output_dir: str, plan: Plan, *, resume: bool) -> tuple[Salvage, Journal]:
  """Sets up this attempt's journal; with `resume`, collects what earlier attempts wrote."""
  directory = resume_dir(output_dir)
  stale_tmp = unfinished_dir(output_dir)
  current = fingerprint(plan)
  fingerprint_path = os.path.join(directory, "fingerprint.json")
  salvage: dict[tuple[str, Block], str] = {}
  generation = 0
  if resume and os.path.isfile(fingerprint_path):
    with open(fingerprint_path, encoding="utf-8") as f:
      previous = json.load(f)
    if previous != current:
      raise ConversionError(
          f"{directory}: cannot resume: the inputs or the plan changed since the interrupted run"
          " (different files, sizes, modification times, flags or target); rerun without --resume"
      )
    journals = sorted(glob.glob(os.path.join(directory, "gen-*.journal")), key=_generation)
    if journals and os.path.isdir(stale_tmp):
      os.replace(stale_tmp, os.path.join(directory, f"gen-{_generation(journals[-1])}"))
    for journal in journals:
      root = _data_root(os.path.join(directory, f"gen-{_generation(journal)}"))
      if root is not None:
        for key in _load_journal(journal):
          salvage[key] = root  # Newer generations override older ones.
    generation = _generation(journals[-1]) + 1 if journals else 0
    referenced = {os.path.dirname(os.path.dirname(root)) for root in salvage.values()}
    for journal in journals:
      data = os.path.join(directory, f"gen-{_generation(journal)}")
      if data not in referenced:
        shutil.rmtree(data, ignore_errors=True)
  else:
    if resume:
      logging.warning("%s has nothing to resume; converting from the start", directory)
    shutil.rmtree(directory, ignore_errors=True)
    if os.path.isdir(stale_tmp):
      shutil.rmtree(stale_tmp)
    os.makedirs(directory)
    with open(fingerprint_path, "w", encoding="utf-8") as f:
      json.dump(current, f)
  return Salvage(salvage), Journal(os.path.join(directory, f"gen-{generation}.journal"))


def with_salvage(plan: Plan, salvage: Salvage) -> Plan:
  """`plan` with every leaf that has salvaged blocks reading them from disk instead of recomputing them."""
  if not salvage.blocks:
    return plan
  leaves = []
  for leaf in plan.leaves:
    name = ".".join(("params", "params", *leaf.path))
    blocks = salvage.for_array(name)
    leaves.append(dataclasses.replace(leaf, loader=SalvagingLoader(leaf.loader, name, blocks)) if blocks else leaf)
  return dataclasses.replace(plan, leaves=tuple(leaves))


def park(output_dir: str, journal: Journal) -> bool:
  """After a failed save: moves Orbax's temporary directory into the resume directory; True if anything was."""
  journal.close()
  tmp = unfinished_dir(output_dir)
  if not os.path.isdir(tmp):
    return False
  os.replace(tmp, os.path.join(resume_dir(output_dir), os.path.basename(journal.path)[: -len(".journal")]))
  return True


def finish(output_dir: str, journal: Journal) -> None:
  journal.close()
  shutil.rmtree(resume_dir(output_dir), ignore_errors=True)


_stores: dict[tuple[str, str], Any] = {}
_stores_lock = threading.Lock()


def _open_salvaged(root: str, array_name: str) -> Any:
  key = (root, array_name)
  with _stores_lock:
    if key not in _stores:
      spec = {"driver": "zarr3", "kvstore": {"driver": "ocdbt", "base": f"file://{root}/", "path": f"{array_name}/"}}
      _stores[key] = ts.open(spec, open=True, read=True).result()
    return _stores[key]


@dataclasses.dataclass(frozen=True)
class SalvagingLoader:
  """A leaf loader that returns blocks an earlier attempt wrote, and asks `inner` for the rest.

  Only a region that is exactly a journaled block is copied (a resumed run with another budget may cut the
  leaf into other blocks; those are recomputed).
  """

  inner: Any
  array_name: str
  salvaged: dict[Block, str]

  @property
  def block_shape(self) -> tuple[int, ...]:
    return self.inner.block_shape

  def __call__(self) -> np.ndarray:
    return self.inner()

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    root = self.salvaged.get((tuple(s.start for s in index), tuple(s.stop for s in index)))
    if root is not None:
      try:
        return np.asarray(_open_salvaged(root, self.array_name)[index].read().result())
      except Exception:  # A block the journal lists but the database lost: recompute it.
        pass
    return self.inner.region(index)
