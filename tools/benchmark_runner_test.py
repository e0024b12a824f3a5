"""The results page every benchmark keeps: every row and column a run printed reaches the page, newest run first,
earlier runs and hand-written text kept; the command recorded as typed.

The page is the record of measured figures, so a renderer that dropped a row, a column or an earlier run would
silently lose measurements; these tests build pages from fake result rows.
"""

import datetime
import os
from unittest import mock

from absl.testing import absltest

from tools import benchmark_runner

_STARTED = datetime.datetime(2026, 12, 3, 21, 14, 5, tzinfo=datetime.timezone.utc)
_MACHINE = "2 cores (Test CPU), 23.4 GiB memory, Linux 6.1 x86_64"
_COMMAND = "bazel run //tools:benchmark -- --family=qwen3_moe --size_gb=2.5 --devices=1,16 --runs=3"

_PAGE = benchmark_runner.ResultsPage("# Test results", "What these figures are.", "<!-- new runs below -->")
_COLUMNS = ("conversion", "size", "devices", "scan", "wall (median)", "peak RSS (and --dry_run's)", "output",
            "throughput", "I/O floor", "codec floor", "wall / max(floors)", "(wall - start-up) / max(floors)",
            "CPU-s: conversion / codec floor", "(CPU-s - start-up CPU-s) / codec floor",
            "(CPU-s - start-up CPU-s) / transpose floor")
_CONVERSIONS = benchmark_runner.ResultTable(
    caption="input 2.49 GB; I/O floor (read the input + write 2.49 GB, fsync) median 2.5 s",
    columns=_COLUMNS,
    rows=(
        ("qwen3_moe -> MaxText", "2.5 GB", "1", "on", "5.6 s", "0.56 GiB", "1.94 GB", "445 MB/s", "2.5 s", "4.1 s",
         "1.38", "1.15", "8.9 / 7.7", "1.04", "0.99"),
        ("qwen3_moe -> MaxText", "2.5 GB", "16", "on", "5.7 s", "0.56 GiB", "1.94 GB", "437 MB/s", "2.5 s", "4.1 s",
         "1.39", "1.16", "8.7 / 7.7", "1.02", "0.97"),
        ("MaxText -> HuggingFace", "2.5 GB", "1", "on", "5.0 s", "0.54 GiB", "2.49 GB", "498 MB/s", "1.6 s", "3.3 s",
         "1.53", "1.25", "8.0 / 5.9", "1.21", "1.15"),
        # An empty cell, as the quantized route's rows have: it must still be a cell of its own.
        ("qwen3_moe -> MaxText, --keep_fp8 (native fp8 output)", "2.5 GB", "1", "on", "8.9 s", "0.84 GiB", "3.19 GB",
         "280 MB/s", "2.6 s", "", "3.43 (I/O)", "3.10", "", "", ""),
    ),
)
_SCALING = benchmark_runner.ResultTable(
    caption="several processes",
    columns=("processes", "wall (median)", "throughput", "CPU, all processes (median)", "peak RSS per process",
             "speed-up (medians)", "speed-up (median of per-round ratios)"),
    rows=(("1 process, pinned to core 0", "12.0 s", "208 MB/s", "11.7 s", "0.53 GiB", "1.00x", "1.00x"),
          ("the codec's work alone, 1 process pinned to core 0", "9.9 s", "251 MB/s", "9.5 s", "", "1.00x",
           "1.00x")),
)


def _cells(line: str) -> list[str]:
  """The cells of one Markdown table line (`| a | b |` -> ["a", "b"])."""
  return [cell.strip() for cell in line.strip()[1:-1].split(" | ")]


def _tables(page: str) -> list[list[list[str]]]:
  """Every Markdown table in `page`, as rows of cells (the header first, the separator left out)."""
  tables, current = [], None
  for line in page.splitlines():
    if line.startswith("|"):
      if current is None:
        current = []
        tables.append(current)
      if not set(line) <= set("|-"):
        current.append(_cells(line))
    else:
      current = None
  return tables


class MarkdownTableTest(absltest.TestCase):

  def test_every_row_and_column_is_rendered(self):
    lines = benchmark_runner.markdown_table(_CONVERSIONS.columns, _CONVERSIONS.rows).splitlines()
    self.assertLen(lines, 2 + len(_CONVERSIONS.rows))
    self.assertEqual(_cells(lines[0]), list(_CONVERSIONS.columns))
    self.assertEqual(lines[1], "|" + "---|" * len(_CONVERSIONS.columns))
    self.assertEqual([_cells(line) for line in lines[2:]], [list(row) for row in _CONVERSIONS.rows])

  def test_a_pipe_in_a_cell_does_not_add_a_column(self):
    line = benchmark_runner.markdown_table(("a", "b"), [("x | y", "z")]).splitlines()[2]
    self.assertEqual(line, "| x \\| y | z |")

  def test_a_row_of_the_wrong_width_is_refused(self):
    with self.assertRaisesRegex(ValueError, "2 cells in a table of 3 columns"):
      benchmark_runner.markdown_table(("a", "b", "c"), [("1", "2")])


class ResultsPageTest(absltest.TestCase):

  def _section(self, started=_STARTED, tables=(_CONVERSIONS, _SCALING), notes=()):
    return benchmark_runner.render_run_section(tables, started, _MACHINE, _COMMAND, notes)

  def test_section_holds_date_machine_command_captions_and_every_table(self):
    section = self._section(notes=["every conversion ran in a memory cgroup limited to 2 GiB"])
    self.assertTrue(section.startswith("## 2026-12-03 21:14 UTC\n"), section)
    self.assertIn(f"- machine: {_MACHINE}\n", section)
    self.assertIn(f"- command: `{_COMMAND}`\n", section)
    self.assertIn("- every conversion ran in a memory cgroup limited to 2 GiB\n", section)
    for table in (_CONVERSIONS, _SCALING):
      self.assertIn(f"\n{table.caption}\n", section)
    expected = [[list(t.columns)] + [list(row) for row in t.rows] for t in (_CONVERSIONS, _SCALING)]
    self.assertEqual(_tables(section), expected)

  def test_the_date_is_given_in_utc(self):
    local = _STARTED.astimezone(datetime.timezone(datetime.timedelta(hours=-8)))
    self.assertTrue(self._section(started=local).startswith("## 2026-12-03 21:14 UTC\n"))

  def test_newest_run_comes_first_and_earlier_runs_are_kept_whole(self):
    first = self._section(tables=(_CONVERSIONS,))
    later = self._section(started=_STARTED + datetime.timedelta(days=1), tables=(_SCALING,))
    page = _PAGE.added(_PAGE.added(None, first), later)
    self.assertLess(page.index("## 2026-12-04 21:14 UTC"), page.index("## 2026-12-03 21:14 UTC"))
    self.assertIn(first, page)
    self.assertIn(later, page)
    self.assertEqual(page.count(_PAGE.title), 1)
    self.assertEqual(page.count(_PAGE.marker), 1)
    self.assertNotIn("\n\n\n", page)
    self.assertEqual(_tables(page), [[list(_SCALING.columns)] + [list(r) for r in _SCALING.rows],
                                     [list(_CONVERSIONS.columns)] + [list(r) for r in _CONVERSIONS.rows]])

  def test_a_page_edited_without_the_marker_keeps_its_text(self):
    page = _PAGE.added("Notes written by hand.\n", self._section())
    self.assertIn(_PAGE.marker, page)
    self.assertLess(page.index("## 2026-12-03"), page.index("Notes written by hand."))

  def test_write_results_page_resolves_relative_paths_from_the_workspace(self):
    workspace = self.create_tempdir().full_path
    with mock.patch.dict(os.environ, {"BUILD_WORKSPACE_DIRECTORY": workspace}):
      written = _PAGE.write("docs/benchmark-results.md", self._section())
      _PAGE.write("docs/benchmark-results.md", self._section(started=_STARTED.replace(day=4)))
    self.assertEqual(written, os.path.join(workspace, "docs", "benchmark-results.md"))
    with open(written) as f:
      page = f.read()
    self.assertEqual(page.count("## 2026-12-0"), 2)
    self.assertEqual(os.listdir(os.path.dirname(written)), ["benchmark-results.md"])


class CommandLineTest(absltest.TestCase):

  def test_bazel_run_is_recorded_as_typed(self):
    with mock.patch.dict(os.environ, {"BUILD_WORKSPACE_DIRECTORY": "/src"}):
      self.assertEqual(benchmark_runner.command_line(["/runfiles/_main/tools/benchmark.py", "--size_gb=0.1", "--runs=1"],
                                                    "//tools:benchmark"),
                       "bazel run //tools:benchmark -- --size_gb=0.1 --runs=1")

  def test_a_direct_run_names_the_script_from_the_repository(self):
    with mock.patch.dict(os.environ, {"BUILD_WORKSPACE_DIRECTORY": ""}):
      script = os.path.join(os.path.dirname(os.path.abspath(benchmark_runner.__file__)), "benchmark.py")
      self.assertEqual(benchmark_runner.command_line([script, "--devices=1"], "//tools:benchmark"), "python tools/benchmark.py --devices=1")



class DryRunLinesTest(absltest.TestCase):

  def test_the_figures_a_dry_run_prints_are_read_in_bytes(self):
    stdout = "leaves: 3\nbytes to write:    1,234 (1.2 KB)\npredicted peak RSS: 0.50 GiB\ntransposed bytes: 2,048\n"
    self.assertEqual(benchmark_runner.dry_run_lines(stdout),
                     {"bytes to write": 1234, "predicted peak RSS": 1 << 29, "transposed bytes": 2048})


class AlternatingTest(absltest.TestCase):

  def test_rounds_alternate_direction_and_report_after_each(self):
    calls, reports = [], []

    def run(name: str):
      def timed() -> float:
        calls.append(name)
        return float(len(calls))
      return timed

    seconds = benchmark_runner.alternating([("a", run("a")), ("b", run("b")), ("c", run("c"))], 3,
                                           lambda i, s: reports.append((i, {k: list(v) for k, v in s.items()})))
    self.assertEqual(calls, ["a", "b", "c", "c", "b", "a", "a", "b", "c"])
    self.assertEqual(seconds, {"a": [1.0, 6.0, 7.0], "b": [2.0, 5.0, 8.0], "c": [3.0, 4.0, 9.0]})
    self.assertEqual([i for i, _ in reports], [0, 1, 2])
    self.assertEqual(reports[0][1], {"a": [1.0], "b": [2.0], "c": [3.0]})


if __name__ == "__main__":
  absltest.main()
