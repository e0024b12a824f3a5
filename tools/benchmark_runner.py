"""What every benchmark shares: the converter run as shipped and measured (wall, CPU-s, peak RSS, its dry run's
prediction), and the results page each keeps in docs/, one dated section a run, newest first.

tools/benchmark.py (conversions against their floors), tools/memory_benchmark.py (whole models, RSS over time)
and the others build on it; each keeps its own flags, tables and page.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import resource
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence

import psutil

from tools.process_sampling import run_sampled

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What every built binary runs under (the .venv's Python, started with the launcher's environment), so that the
# children measured are the converter as shipped; sys.executable where the launcher is not at hand.
_LAUNCHER = os.path.join(REPO, "tools", "python3")
PYTHON = _LAUNCHER if os.access(_LAUNCHER, os.X_OK) else sys.executable
CONVERTER = [PYTHON, os.path.join(REPO, "converter", "main.py")]
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def child_env() -> dict[str, str]:
  """The environment a measured child runs in: this checkout first on its path."""
  return dict(os.environ, PYTHONPATH=REPO)


def children_cpu_seconds() -> float:
  """User + system seconds of every child waited for so far."""
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


@dataclasses.dataclass(frozen=True)
class Measured:
  wall: float  # Seconds.
  peak: int  # Peak RSS of the process tree, bytes.
  cpu: float  # User + system seconds of every thread and child.
  stdout: str


def measure(label: str, command: list[str], env: dict[str, str] | None = None,
            trace: list[tuple[float, int]] | None = None) -> Measured:
  """Runs `command` with its RSS sampled (tools/process_sampling.py; every sample into `trace` when given); exits
  naming `label` if it fails."""
  cpu_before = children_cpu_seconds()
  wall, peak, result = run_sampled(command, env or child_env(), trace)
  cpu = children_cpu_seconds() - cpu_before
  if result.returncode:
    sys.exit(f"{label} failed ({result.returncode}):\n{result.stderr[-3000:]}")
  return Measured(wall, peak, cpu, result.stdout)


def dry_run_lines(stdout: str) -> dict[str, int]:
  """What a `--dry_run` printed, by name, in bytes: `predicted peak RSS`, `transposed bytes`, `bytes to write`
  (those it printed)."""
  found = {}
  for line in stdout.splitlines():
    name, _, value = line.partition(":")
    if name == "predicted peak RSS":
      number, unit = value.split()[:2]
      found[name] = int(float(number) * _UNITS[unit])
    elif name in ("transposed bytes", "bytes to write"):
      found[name] = int(value.split()[0].replace(",", ""))
  return found


def dry_run(command: list[str], env: dict[str, str], *wanted: str) -> list[int]:
  """`wanted` figures (names as `dry_run_lines` gives them) that `command` + `--dry_run` predicts from the headers
  alone; exits if it printed any of them not."""
  result = subprocess.run([*command, "--dry_run"], env=env, capture_output=True, text=True)
  found = dry_run_lines(result.stdout)
  missing = [name for name in wanted if name not in found]
  if missing:
    sys.exit(f"--dry_run printed no {', '.join(missing)} ({result.returncode}):\n{result.stderr[-3000:]}")
  return [found[name] for name in wanted]


def alternating(runs: Sequence[tuple[str, Callable[[], float]]], rounds: int,
                after_round: Callable[[int, dict[str, list[float]]], None] | None = None) -> dict[str, list[float]]:
  """Each named run's seconds, `rounds` times, in alternating order (forwards, then backwards), so that a machine's
  drift over the run falls on every run alike; `after_round(round_index, seconds so far)` after each round."""
  seconds: dict[str, list[float]] = {name: [] for name, _ in runs}
  for round_index in range(rounds):
    for name, run in runs if round_index % 2 == 0 else runs[::-1]:
      seconds[name].append(run())
    if after_round is not None:
      after_round(round_index, seconds)
  return seconds


def files(directory: str, suffix: str = "") -> list[str]:
  """Every file below `directory` whose name ends with `suffix`, sorted."""
  return sorted(os.path.join(root, name) for root, _, names in os.walk(directory) for name in names
                if name.endswith(suffix))


def du(path: str) -> int:
  """The bytes of every file below `path`."""
  return sum(os.path.getsize(f) for f in files(path))


def workspace_path(path: str) -> str:
  """`path` as given when absolute; else from the workspace `bazel run` started in, or the repository root."""
  return path if os.path.isabs(path) else os.path.join(os.environ.get("BUILD_WORKSPACE_DIRECTORY") or REPO, path)


@dataclasses.dataclass(frozen=True)
class ResultTable:
  """One table a run prints, kept as data: the terminal and the results page are rendered from the same rows and
  columns, so the page cannot drift from what the run measured.

  `caption` is the text printed above the table (the floors its ratios are taken against); every row has one cell
  per column.
  """

  caption: str
  columns: tuple[str, ...]
  rows: tuple[tuple[str, ...], ...]


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  """`columns` and `rows` as a Markdown table (no trailing newline). A `|` inside a cell is escaped, so that a cell
  can never split into two columns."""
  escape = lambda cell: str(cell).replace("|", "\\|")
  for row in rows:
    if len(row) != len(columns):
      raise ValueError(f"a row of {len(row)} cells in a table of {len(columns)} columns: {row}")
  lines = ["| " + " | ".join(escape(c) for c in columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(escape(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def print_table(table: ResultTable) -> None:
  if table.caption:
    print(f"\n{table.caption}")
  print(markdown_table(table.columns, table.rows), flush=True)


def render_run_section(tables: Sequence[ResultTable], started: datetime.datetime, machine: str, command: str,
                       notes: Sequence[str] = ()) -> str:
  """One run's section of the results page: a heading with the run's start time (UTC), the machine and the exact
  command (what a reader needs to reproduce or compare a figure), `notes`, then every table with its caption."""
  stamp = started.astimezone(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
  parts = [f"## {stamp}", "", f"- machine: {machine}", f"- command: `{command}`"]
  parts += [f"- {note}" for note in notes]
  for table in tables:
    parts.append("")
    if table.caption:
      parts += [table.caption, ""]
    parts.append(markdown_table(table.columns, table.rows))
  return "\n".join(parts) + "\n"


@dataclasses.dataclass(frozen=True)
class ResultsPage:
  """A benchmark's page in docs/: its title and introduction, then a dated section per run below `marker`, newest
  first, so that the page's own introduction stays at the top."""

  title: str  # "# Benchmark results"
  introduction: str
  marker: str

  def added(self, page: str | None, section: str) -> str:
    """The page with `section` added as its newest run: below the marker line, above every earlier run. A missing
    page (None or empty) is started with the title and introduction; a page without the marker (edited by hand)
    keeps its text below the new head, marker and section."""
    if page and self.marker in page:
      head, earlier = page.split(self.marker, 1)
    else:
      head, earlier = f"{self.title}\n\n{self.introduction}\n\n", page or ""
    earlier = earlier.strip("\n")
    return f"{head}{self.marker}\n\n{section.rstrip(chr(10))}\n" + (f"\n{earlier}\n" if earlier else "")

  def write(self, path: str, section: str) -> str:
    """Adds `section` to the page at `path` (`workspace_path`); returns the path written."""
    path = workspace_path(path)
    page = None
    if os.path.exists(path):
      with open(path) as f:
        page = f.read()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
      f.write(self.added(page, section))
    os.replace(path + ".tmp", path)
    return path


def machine_description() -> str:
  """Cores, memory, CPU model and kernel: what the walls of a run depend on besides the code."""
  model = ""
  try:
    with open("/proc/cpuinfo") as f:
      model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
  except OSError:
    pass
  memory = psutil.virtual_memory().total / 2**30
  return (f"{os.cpu_count()} cores{f' ({model})' if model else ''}, {memory:.1f} GiB memory,"
          f" {platform.system()} {platform.release()} {platform.machine()}")


def command_line(argv: Sequence[str], target: str) -> str:
  """The command that started this run, as a user would type it again (`bazel run` hides its own arguments behind
  the runfiles path of argv[0]); `target` is the benchmark's Bazel target (//tools:benchmark)."""
  if os.environ.get("BUILD_WORKSPACE_DIRECTORY"):
    return " ".join([f"bazel run {target} --", shlex.join(argv[1:])]).strip()
  program = os.path.relpath(os.path.abspath(argv[0]), REPO) if argv else f"tools/{target.split(':')[-1]}.py"
  return f"python {shlex.join([program, *argv[1:]])}"
