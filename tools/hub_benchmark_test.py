"""The Hub benchmark's measures: local disk counted as it is occupied (a cache's links to its blobs once), sampled
over a run, and each run's medians against the floors."""

import os
import time

from absl.testing import absltest

from tools import hub_benchmark


class DiskUseTest(absltest.TestCase):

  def test_a_linked_blob_counts_once(self):
    cache = self.create_tempdir().full_path
    os.makedirs(os.path.join(cache, "blobs"))
    os.makedirs(os.path.join(cache, "snapshots", "c0"))
    with open(os.path.join(cache, "blobs", "b0"), "wb") as f:
      f.write(os.urandom(1 << 20))
    os.symlink(os.path.join("..", "..", "blobs", "b0"), os.path.join(cache, "snapshots", "c0", "model.safetensors"))
    self.assertBetween(hub_benchmark.disk_use(cache), 1 << 20, (1 << 20) + (64 << 10))

  def test_sampled_while_a_run_writes(self):
    directory = self.create_tempdir().full_path
    with hub_benchmark.DiskSampler(directory) as disk:
      time.sleep(0.3)
      with open(os.path.join(directory, "f"), "wb") as f:
        f.write(os.urandom(2 << 20))
      time.sleep(0.5)
      os.remove(os.path.join(directory, "f"))
      time.sleep(0.3)
    self.assertGreaterEqual(disk.peak, 2 << 20)
    self.assertEqual(disk.trace[0][1], 0)
    self.assertEqual(disk.trace[-1][1], 0)


class SummaryTest(absltest.TestCase):

  def test_medians_against_the_floors(self):
    run = lambda wall, fetched, **more: {"wall": wall, "cpu": 1.0, "peak": 1 << 30, "disk": 0, "fetched": fetched,
                                         **more}
    figures = {"download": [run(30, 100), run(20, 100), run(25, 100)], "local": [run(10, 0)] * 3,
               "hub": [run(26, 101, requests=7), run(27.5, 101, requests=9), run(40, 101, requests=8)],
               "download first": [run(36, 100, requests=2)] * 3}
    rows = {row[0]: row for row in hub_benchmark.summary_rows(figures, needed=100)}
    self.assertEqual(rows["hub"][1:3], ("27.5 s", "1.10x the longer floor"))
    self.assertEqual(rows["hub"][6:], ("0.00 GB (1.010x)", "8"))
    self.assertEqual(rows["download first"][2], "1.03x the floors' sum")
    self.assertEqual(rows["local"][6:], ("-", "-"))
    self.assertEqual(rows["local"][5], "0 KiB")


if __name__ == "__main__":
  absltest.main()
