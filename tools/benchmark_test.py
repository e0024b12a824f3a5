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
