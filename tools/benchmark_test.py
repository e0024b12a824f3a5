"""The benchmark's results page (every row and column a run printed reaches the page, newest run first) and the
bytes its codec floor encodes.

The page is the record of measured figures (docs/benchmark-results.md), so a renderer that dropped a row, a column
or an earlier run would silently lose measurements; these tests build pages from fake result rows. A floor that
encoded other bytes than the input's, or copied them where a conversion does not, would be no floor.
"""

import datetime
import os
from unittest import mock

import numpy as np
from absl.testing import absltest, flagsaver

from tools import benchmark

_STARTED = datetime.datetime(2026, 12, 3, 21, 14, 5, tzinfo=datetime.timezone.utc)
_MACHINE = "2 cores (Test CPU), 23.4 GiB memory, Linux 6.1 x86_64"
_COMMAND = "bazel run //tools:benchmark -- --family=qwen3_moe --size_gb=2.5 --devices=1,16 --runs=3"

_CONVERSIONS = benchmark.ResultTable(
    caption="input 2.49 GB; I/O floor (read the input + write 2.49 GB, fsync) median 2.5 s",
    columns=benchmark.CONVERSION_COLUMNS,
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
_SCALING = benchmark.ResultTable(
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
    lines = benchmark.markdown_table(_CONVERSIONS.columns, _CONVERSIONS.rows).splitlines()
    self.assertLen(lines, 2 + len(_CONVERSIONS.rows))
    self.assertEqual(_cells(lines[0]), list(_CONVERSIONS.columns))
    self.assertEqual(lines[1], "|" + "---|" * len(_CONVERSIONS.columns))
    self.assertEqual([_cells(line) for line in lines[2:]], [list(row) for row in _CONVERSIONS.rows])

  def test_a_pipe_in_a_cell_does_not_add_a_column(self):
    line = benchmark.markdown_table(("a", "b"), [("x | y", "z")]).splitlines()[2]
    self.assertEqual(line, "| x \\| y | z |")

  def test_a_row_of_the_wrong_width_is_refused(self):
    with self.assertRaisesRegex(ValueError, "2 cells in a table of 3 columns"):
      benchmark.markdown_table(("a", "b", "c"), [("1", "2")])


class ResultsPageTest(absltest.TestCase):

  def _section(self, started=_STARTED, tables=(_CONVERSIONS, _SCALING), notes=()):
    return benchmark.render_run_section(tables, started, _MACHINE, _COMMAND, notes)

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

  def test_a_new_page_starts_with_its_title_and_links_its_explanation(self):
    page = benchmark.add_run_to_results_page(None, self._section())
    self.assertTrue(page.startswith(benchmark.RESULTS_PAGE_TITLE + "\n"), page)
    self.assertIn("[benchmarks.md](benchmarks.md)", page)
    self.assertIn(benchmark.RESULTS_PAGE_MARKER, page)
    self.assertEqual(len(_tables(page)), 2)
    self.assertTrue(page.endswith("|\n"), page)

  def test_newest_run_comes_first_and_earlier_runs_are_kept_whole(self):
    first = self._section(tables=(_CONVERSIONS,))
    later = self._section(started=_STARTED + datetime.timedelta(days=1), tables=(_SCALING,))
    page = benchmark.add_run_to_results_page(benchmark.add_run_to_results_page(None, first), later)
    self.assertLess(page.index("## 2026-12-04 21:14 UTC"), page.index("## 2026-12-03 21:14 UTC"))
    self.assertIn(first, page)
    self.assertIn(later, page)
    self.assertEqual(page.count(benchmark.RESULTS_PAGE_TITLE), 1)
    self.assertEqual(page.count(benchmark.RESULTS_PAGE_MARKER), 1)
    self.assertNotIn("\n\n\n", page)
    self.assertEqual(_tables(page), [[list(_SCALING.columns)] + [list(r) for r in _SCALING.rows],
                                     [list(_CONVERSIONS.columns)] + [list(r) for r in _CONVERSIONS.rows]])

  def test_a_page_edited_without_the_marker_keeps_its_text(self):
    page = benchmark.add_run_to_results_page("Notes written by hand.\n", self._section())
    self.assertIn(benchmark.RESULTS_PAGE_MARKER, page)
    self.assertLess(page.index("## 2026-12-03"), page.index("Notes written by hand."))

  def test_write_results_page_resolves_relative_paths_from_the_workspace(self):
    workspace = self.create_tempdir().full_path
    with mock.patch.dict(os.environ, {"BUILD_WORKSPACE_DIRECTORY": workspace}):
      written = benchmark.write_results_page("docs/benchmark-results.md", self._section())
      benchmark.write_results_page("docs/benchmark-results.md", self._section(started=_STARTED.replace(day=4)))
    self.assertEqual(written, os.path.join(workspace, "docs", "benchmark-results.md"))
    with open(written) as f:
      page = f.read()
    self.assertEqual(page.count("## 2026-12-0"), 2)
    self.assertEqual(os.listdir(os.path.dirname(written)), ["benchmark-results.md"])


class RowTest(absltest.TestCase):

  def test_a_relayout_row_names_both_scans_and_has_no_transpose_floor(self):
    row = benchmark._row("MaxText -> MaxText (--checkpoint_path, bfloat16)", "1", 10.0, 2**30, 2 * 10**9, 2 * 10**9,
                         4.0, 8.0, (2.0, 1.0), cpu=(17.0, 16.0, None), predicted_peak=2**29, scan="on -> off")
    self.assertLen(row, len(benchmark.CONVERSION_COLUMNS))
    cell = dict(zip(benchmark.CONVERSION_COLUMNS, row))
    self.assertEqual(cell["scan"], "on -> off")
    self.assertEqual(cell["peak RSS (and --dry_run's)"], "1.00 GiB (--dry_run: 0.50 GiB, -50%)")
    self.assertEqual(cell["wall / max(floors)"], "1.25")  # Against the larger floor: the codec's 8 s.
    self.assertEqual(cell["(wall - start-up) / max(floors)"], "1.00")
    self.assertEqual(cell["CPU-s: conversion / codec floor"], "17.0 / 16.0")
    self.assertEqual(cell["(CPU-s - start-up CPU-s) / codec floor"], "1.00")
    self.assertEqual(cell["(CPU-s - start-up CPU-s) / transpose floor"], "")

  def test_the_relayout_flips_the_scan_and_writes_bfloat16(self):
    with flagsaver.flagsaver(scan_layers=True):
      command = benchmark._relayout_command("/out/0/items", "/relayout", "1")
    self.assertIn("--direction=to_maxtext", command)
    self.assertIn("--checkpoint_path=/out/0/items", command)
    self.assertIn("--scan_layers=False", command)
    self.assertIn("--save_dtype=bfloat16", command)


class CommandLineTest(absltest.TestCase):

  def test_bazel_run_is_recorded_as_typed(self):
    with mock.patch.dict(os.environ, {"BUILD_WORKSPACE_DIRECTORY": "/src"}):
      self.assertEqual(benchmark.command_line(["/runfiles/_main/tools/benchmark.py", "--size_gb=0.1", "--runs=1"]),
                       "bazel run //tools:benchmark -- --size_gb=0.1 --runs=1")

  def test_a_direct_run_names_the_script_from_the_repository(self):
    with mock.patch.dict(os.environ, {"BUILD_WORKSPACE_DIRECTORY": ""}):
      script = os.path.join(os.path.dirname(os.path.abspath(benchmark.__file__)), "benchmark.py")
      self.assertEqual(benchmark.command_line([script, "--devices=1"]), "python tools/benchmark.py --devices=1")


class FloorPiecesTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    directory = self.create_tempdir().full_path
    self.first, self.second = os.urandom(20), os.urandom(6)
    self.files = []
    for name, data in (("a.safetensors", self.first), ("b.safetensors", self.second)):
      self.files.append(os.path.join(directory, name))
      with open(self.files[-1], "wb") as f:
        f.write(data)

  def _pieces(self, count: int, share: int = 0, shares: int = 1) -> list[bytes]:
    return [p.tobytes() for p in benchmark.floor_pieces(self.files, count, 8, share, shares)]

  def test_pieces_cut_each_file_from_its_start_pad_its_last_and_start_again(self):
    pad = lambda b: b + bytes(8 - len(b))
    a, b = self.first, self.second
    self.assertEqual(self._pieces(6), [a[:8], a[8:16], pad(a[16:]), pad(b), a[:8], a[8:16]])

  def test_a_share_takes_every_shares_th_piece_counted_across_passes(self):
    pad = lambda b: b + bytes(8 - len(b))
    self.assertEqual(self._pieces(3, share=1, shares=2), [self.first[8:16], pad(self.second), self.first[8:16]])

  def test_whole_pieces_are_read_only_views_of_the_files_not_copies(self):
    whole = next(benchmark.floor_pieces(self.files, 1, 8))
    self.assertFalse(whole.flags.owndata)
    self.assertFalse(whole.flags.writeable)
    self.assertEqual(whole.dtype, np.uint16)

  def test_files_without_bytes_are_refused_instead_of_looping(self):
    empty = os.path.join(self.create_tempdir().full_path, "empty.safetensors")
    open(empty, "wb").close()
    with self.assertRaisesRegex(ValueError, "no bytes"):
      next(benchmark.floor_pieces([empty], 1, 8))


if __name__ == "__main__":
  absltest.main()
