"""The one-host restore benchmark's table and page: ratios to the pre-sharded row and to both floors, medians of
the rounds, and a new section added on top of the page's older ones."""

import os

from absl import flags
from absl.testing import absltest

from tools import host_restore_benchmark as benchmark

FLAGS = flags.FLAGS


class TableTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    FLAGS(["host_restore_benchmark_test"])

  def test_ratios_are_of_the_medians_to_the_pre_sharded_and_to_both_floors(self):
    rows = {"default": [6.0, 9.0, 5.0], "target_mesh": [8.0, 8.0, 8.0], "nochunk": [4.0, 4.0, 4.0],
            "presharded": [5.0, 5.0, 20.0]}
    floor = {"read": 1.0, "decode": 2.0, "copy": 1.0, "stored": 3e9, "logical": 4e9}
    table = benchmark._table(rows, floor, {"default": 3e9, "target_mesh": 3e9, "nochunk": 3e9, "presharded": 3.1e9}, "tpu", 8)
    self.assertIn("| default | 3.00 | 6.00 | 6.00, 9.00, 5.00 | 1.20x | 3.00x | 1.50x |", table)
    self.assertIn("| 3.10 | 5.00 | 5.00, 5.00, 20.00 | 1.00x | 2.50x | 1.25x |", table)
    self.assertIn("all overlapped 2.00 s, none 4.00 s", table)
    self.assertIn("tpu, 8 devices", table)
    self.assertIn("| --target_mesh=fsdp=8 (this host's shards) | 3.00 | 8.00 |", table)
    self.assertIn("tpu, 1 device,", benchmark._table(rows, floor, {k: 1e9 for k in rows}, "tpu", 1))

  def test_a_new_section_goes_above_the_older_ones(self):
    page = os.path.join(self.create_tempdir().full_path, "results.md")
    with open(page, "w", encoding="utf-8") as f:
      f.write("# Restore results\n\nWhat this page is.\n\n## Older\n\nold table\n")
    benchmark._add_to_page(page, "## Newer\n\nnew table\n")
    with open(page, encoding="utf-8") as f:
      text = f.read()
    self.assertEqual(text, "# Restore results\n\nWhat this page is.\n\n## Newer\n\nnew table\n\n## Older\n\nold table\n")


if __name__ == "__main__":
  absltest.main()
