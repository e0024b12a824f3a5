"""The conversion benchmark's own page and rows: a new page starts with its title and links what the columns mean;
a re-layout row names both scans and is held to its own floors (the page itself: benchmark_runner_test.py; the
floors' bytes: floors_test.py)."""

import datetime

from absl.testing import absltest, flagsaver

from tools import benchmark, benchmark_runner

class ResultsPageTest(absltest.TestCase):

  def test_a_new_page_starts_with_its_title_and_links_its_explanation(self):
    row = ("qwen3_moe -> MaxText",) + ("",) * (len(benchmark.CONVERSION_COLUMNS) - 1)
    table = benchmark_runner.ResultTable("a run", benchmark.CONVERSION_COLUMNS, (row,))
    section = benchmark_runner.render_run_section(
        (table,), datetime.datetime(2026, 12, 3, tzinfo=datetime.timezone.utc), "2 cores", "bazel run //tools:benchmark")
    page = benchmark.RESULTS_PAGE.added(None, section)
    self.assertTrue(page.startswith("# Benchmark results\n"), page)
    self.assertIn("[benchmarks.md](benchmarks.md)", page)
    self.assertLess(page.index(benchmark.RESULTS_PAGE.marker), page.index("| qwen3_moe -> MaxText |"))


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
