"""A training run's checkpoint directory: its steps, which of them are committed, and the one `--step` names.

Orbax's CheckpointManager saves step N of a run as RUN_DIR/N/<item> (`items` for MaxText's trainers and this
converter, `model_params` for Tunix's), and MaxText puts its run's steps under RUN_DIR/checkpoints/. A step is
committed when Orbax finished it: on a local disk the step is written as `N.orbax-checkpoint-tmp-<time>` and
renamed to N at the end, so a directory named N is committed; in a bucket it is written in place and
`commit_success.txt` is written into it last, so only a step holding that marker is.
"""

from __future__ import annotations

import dataclasses

from converter import storage
from converter.checkpoint_format import layout
from converter.errors import ConversionError

LATEST = "latest"
MAXTEXT_CHECKPOINTS = "checkpoints"  # MaxText's run directory keeps its steps here (base_output_dir/run/checkpoints).


@dataclasses.dataclass(frozen=True)
class Step:
  number: int
  path: str
  committed: bool

  def describe(self) -> str:
    return str(self.number) if self.committed else f"{self.number} (uncommitted)"


def is_checkpoint(path: str) -> bool:
  """Whether `path` is one step's checkpoint already: an items directory, or a step directory holding one."""
  return any(storage.is_file(layout.tree_metadata_path(storage.join(path, *names)))
             for names in ((), (layout.ITEMS,), (layout.TUNIX_MODEL_PARAMS,)))


def _committed(step_dir: str) -> bool:
  if storage.exists(storage.join(step_dir, layout.COMMIT_MARKER)):
    return True
  return not storage.is_remote(step_dir)  # Renamed from its temporary name: the rename was the commit.


def run_steps(run_dir: str) -> list[Step]:
  """The steps of the run directory `run_dir` (or of its MaxText `checkpoints/`), in order; [] when it has none.
  Orbax's temporary directories (`N.orbax-checkpoint-tmp-...`) are not steps: their names are not numbers."""
  for directory in (run_dir, storage.join(run_dir, MAXTEXT_CHECKPOINTS)):
    numbers = sorted(int(name) for name in storage.list_names(directory) if name.isascii() and name.isdigit())
    if numbers:
      return [Step(n, storage.join(directory, str(n)), _committed(storage.join(directory, str(n)))) for n in numbers]
  return []


def parse_step(value: str) -> int | None:
  """--step's value: None for `latest`, else the step number."""
  if value == LATEST:
    return None
  if not (value.isascii() and value.isdigit()):
    raise ConversionError(f"--step={value!r}: expected {LATEST} or a step number")
  return int(value)


def select_step(steps: list[Step], step: str, where: str) -> Step:
  """The step `step` (--step: `latest`, the highest committed one, or a number) among the steps of the run
  directory `where`. An explicit number is taken committed or not: the reader says what it makes of that."""
  number = parse_step(step)
  present = ", ".join(s.describe() for s in steps)
  if number is None:
    committed = [s for s in steps if s.committed]
    if not committed:
      raise ConversionError(f"{where}: no committed step (steps present: {present}); an uncommitted one can be"
                            " named with --step=N")
    return committed[-1]
  for candidate in steps:
    if candidate.number == number:
      return candidate
  raise ConversionError(f"{where}: no step {number}; steps present: {present}")


def checkpoint_of(path: str, step: str = LATEST, step_given: bool = False) -> str:
  """--checkpoint_path resolved to one step's checkpoint: an items or step directory as it is, a run directory's
  step `step`. A path that is neither is returned unchanged, for the reader to name what it lacks."""
  path = storage.resolve(path)
  if is_checkpoint(path):
    if step_given:
      raise ConversionError(f"--step={step}: {path} is one step's checkpoint already; --step selects a step of a"
                            " run directory (RUN_DIR/<step>/items)")
    return path
  steps = run_steps(path)
  if not steps:
    if step_given:
      raise ConversionError(f"--step={step}: {path} holds no steps (RUN_DIR/<step>/items)")
    return path
  return select_step(steps, step, storage.parent(steps[0].path)).path
