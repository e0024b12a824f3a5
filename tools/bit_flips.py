"""Flips one random bit of a converted checkpoint's stored data and restores it, trial after trial.

What a damaged byte on a disk or in a bucket does to a restore: each trial copies the step, flips one bit chosen
uniformly over the bytes of its OCDBT data files (`d/*`: every stored chunk, shard index and B-tree node), restores
it through stock Orbax, and compares the result with the intact checkpoint's, bit for bit. A restore either
raises (detected), returns the same values (the bit was in bytes nothing reads), or returns other values without a
word (silent): the outcome a training run must never meet.

  bazel run //tools:bit_flips -- --checkpoint=/ckpt/out/0/items --trials=100 --api=v0
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import random
import shutil
from typing import Any, Callable, Sequence

from absl import app, flags, logging

from converter.storage import scratch

OUTCOMES = ("silent", "raised", "harmless")


@dataclasses.dataclass(frozen=True)
class Flip:
  path: str  # Relative to the step directory.
  offset: int
  bit: int


def data_files(step_dir: str) -> list[str]:
  """The OCDBT data files under a step (every process's), relative to it, in a stable order."""
  found = glob.glob(os.path.join(step_dir, "**", "d", "*"), recursive=True)
  return sorted(os.path.relpath(path, step_dir) for path in found if os.path.isfile(path))


def pick_flip(step_dir: str, rng: random.Random) -> Flip:
  """One bit, uniform over every byte of the step's data files."""
  files = data_files(step_dir)
  sizes = [os.path.getsize(os.path.join(step_dir, name)) for name in files]
  if not files or not sum(sizes):
    raise ValueError(f"{step_dir}: no OCDBT data files to damage")
  at = rng.randrange(sum(sizes))
  for name, size in zip(files, sizes):
    if at < size:
      return Flip(name, at, rng.randrange(8))
    at -= size
  raise AssertionError("unreachable")


def apply_flip(step_dir: str, flip: Flip) -> None:
  with open(os.path.join(step_dir, flip.path), "r+b") as f:
    f.seek(flip.offset)
    byte = f.read(1)[0]
    f.seek(flip.offset)
    f.write(bytes([byte ^ (1 << flip.bit)]))


def run_trials(items_path: str, trials: int, restore: Callable[[str], Any],
               same: Callable[[Any, Any], bool], seed: int = 0) -> collections.Counter:
  """Counts of OUTCOMES over `trials` single-bit flips of the step holding `items_path` (`OUT/0/items`);
  `restore(items)` reads a checkpoint, `same(a, b)` compares two restores bit for bit."""
  items_path = os.path.abspath(items_path.rstrip("/"))
  step_dir, items_name = os.path.dirname(items_path), os.path.basename(items_path)
  intact = restore(items_path)
  rng = random.Random(seed)
  counts: collections.Counter = collections.Counter({outcome: 0 for outcome in OUTCOMES})
  with scratch.directory("bit-flips", os.environ.get("TEST_TMPDIR")) as trials_dir:
    for trial in range(trials):
      copy = os.path.join(trials_dir, str(trial))
      shutil.copytree(step_dir, copy)
      apply_flip(copy, pick_flip(copy, rng))
      try:
        damaged = restore(os.path.join(copy, items_name))
      except Exception:  # pylint: disable=broad-except  (any error the restore raises is a detection)
        counts["raised"] += 1
      else:
        counts["harmless" if same(damaged, intact) else "silent"] += 1
      shutil.rmtree(copy)
  return counts


def orbax_trials(items_path: str, trials: int, api: str = "v0", seed: int = 0) -> collections.Counter:
  """`run_trials` restoring through stock Orbax: v0's `PyTreeCheckpointer` (as MaxText) or v1's `load`."""
  from tools import checkpoint_io  # pylint: disable=g-import-not-at-top  (JAX and Orbax)

  if api == "v0":
    restore = checkpoint_io.restore_v0
  else:
    like = checkpoint_io.restore_v0(items_path)
    restore = lambda items: checkpoint_io.restore_v1(items, like)
  same = lambda a, b: not checkpoint_io.trees_bit_identical(a, b)
  return run_trials(items_path, trials, restore, same, seed)


_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "A converted checkpoint's items path, OUT/0/items.")
_TRIALS = flags.DEFINE_integer("trials", 100, "Single-bit flips, each on a fresh copy of the step.", lower_bound=1)
_API = flags.DEFINE_enum("api", "v0", ["v0", "v1"], "The Orbax API each restore goes through.")
_SEED = flags.DEFINE_integer("seed", 0, "Which bits are flipped.")


def main(argv: Sequence[str]) -> None:
  del argv
  import jax  # pylint: disable=g-import-not-at-top

  logging.set_verbosity(logging.ERROR)  # Orbax logs every restore, and every failed one at length.
  jax.config.update("jax_platforms", "cpu")
  checkpoint = os.path.join(os.environ.get("BUILD_WORKING_DIRECTORY", ""), _CHECKPOINT.value)
  counts = orbax_trials(checkpoint, _TRIALS.value, _API.value, _SEED.value)
  print(f"{checkpoint}: {_TRIALS.value} single-bit flips restored through Orbax {_API.value}: "
        + ", ".join(f"{counts[outcome]} {outcome}" for outcome in OUTCOMES))


if __name__ == "__main__":
  flags.mark_flag_as_required("checkpoint")
  app.run(main)
