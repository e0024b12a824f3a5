"""The conversion benchmark's own page and rows: a new page starts with its title and links what the columns mean;
a re-layout row names both scans and is held to its own floors (the page itself: benchmark_runner_test.py; the
floors' bytes: floors_test.py)."""

import datetime

from absl.testing import absltest, flagsaver

from tools import benchmark, benchmark_runner

_STARTED = datetime.datetime(2026, 12, 3, 21, 14, 5, tzinfo=datetime.timezone.utc)
_MACHINE = "2 cores (Test CPU), 23.4 GiB memory, Linux 6.1 x86_64"
_COMMAND = "bazel run //tools:benchmark -- --family=qwen3_moe --size_gb=2.5 --devices=1,16 --runs=3"

_CONVERSIONS = benchmark_runner.ResultTable(
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


class ResultsPageTest(absltest.TestCase):

  def test_a_new_page_starts_with_its_title_and_links_its_explanation(self):
    section = benchmark_runner.render_run_section((_CONVERSIONS, _SCALING), _STARTED, _MACHINE, _COMMAND)
    page = benchmark.RESULTS_PAGE.added(None, section)
    self.assertTrue(page.startswith("# Benchmark results\n"), page)
    self.assertIn("[benchmarks.md](benchmarks.md)", page)
    self.assertIn(benchmark.RESULTS_PAGE.marker, page)
    self.assertEqual(len(_tables(page)), 2)
    self.assertTrue(page.endswith("|\n"), page)


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


if __name__ == "__main__":
  absltest.main()
