"""A local output: the HF checkpoint staged and published whole, the lock's destination, the fsync'd journal."""

import json
import os
import tempfile
from unittest import mock

from absl.testing import absltest

from converter.errors import ConversionError
from converter.output import local
from converter.reverse.safetensors_output import INDEX_FILE
from handlers import BlockWritten


def _scratch() -> str:
  return tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())


class PublishTest(absltest.TestCase):

  def test_everything_is_synced_before_the_rename_and_the_rename_after(self):
    parent = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    staging, output_dir = os.path.join(parent, ".out.tmp"), os.path.join(parent, "out")
    os.makedirs(staging)
    for name in ("model-00001-of-00002.safetensors", INDEX_FILE, "config.json"):
      with open(os.path.join(staging, name), "w") as f:
        f.write("{}")
    events = []
    real_rename = os.rename
    with mock.patch.object(local, "sync", lambda path: events.append(("sync", path))), \
         mock.patch.object(os, "rename", lambda a, b: (events.append(("rename", b)), real_rename(a, b))):
      local.LocalDisk(output_dir).publish(staging, (INDEX_FILE, "config.json"))
    self.assertEqual(events, [("sync", os.path.join(staging, INDEX_FILE)),
                              ("sync", os.path.join(staging, "config.json")), ("sync", staging),
                              ("rename", output_dir), ("sync", parent)])
    self.assertTrue(os.path.isfile(os.path.join(output_dir, "config.json")))


class StageTest(absltest.TestCase):

  def test_a_non_empty_output_needs_overwrite(self):
    output_dir = os.path.join(_scratch(), "out")
    os.makedirs(output_dir)
    with open(os.path.join(output_dir, "config.json"), "w") as f:
      f.write("{}")
    with self.assertRaisesRegex(ConversionError, "already exists and is not empty; pass --overwrite"):
      local.LocalDisk(output_dir).stage(overwrite=False, shared=False)
    staging = local.LocalDisk(output_dir).stage(overwrite=True, shared=False)
    self.assertEqual(os.path.dirname(staging), os.path.dirname(output_dir))
    self.assertTrue(os.path.basename(staging).startswith(".out.hf2maxtext-tmp-"))

  def test_a_file_in_the_way_is_refused_even_with_overwrite(self):
    output_dir = os.path.join(_scratch(), "out")
    with open(output_dir, "w") as f:
      f.write("x")
    with self.assertRaisesRegex(ConversionError, "exists and is not a directory"):
      local.LocalDisk(output_dir).stage(overwrite=True, shared=False)

  def test_shared_staging_has_a_fixed_name_and_a_dead_runs_is_replaced(self):
    disk = local.LocalDisk(os.path.join(_scratch(), "out"))
    os.makedirs(disk.shared_staging())
    with open(os.path.join(disk.shared_staging(), "stale.safetensors"), "w") as f:
      f.write("x")
    self.assertEqual(disk.stage(overwrite=False, shared=True), disk.shared_staging())
    self.assertEqual(os.listdir(disk.shared_staging()), [])

  def test_a_killed_way_backs_staging_goes_and_a_half_published_one_stays(self):
    parent = _scratch()
    disk = local.LocalDisk(os.path.join(parent, "out"))
    os.makedirs(disk.path)
    dead, replaced, mid_swap = (os.path.join(parent, f".out.hf2maxtext-tmp-{n}") for n in ("dead", "done", "swap"))
    for path in (dead, replaced + ".old", mid_swap, mid_swap + ".old", os.path.join(parent, ".other.hf2maxtext-tmp-x")):
      os.makedirs(path)
    staging = disk.stage(overwrite=True, shared=False)
    self.assertCountEqual(os.listdir(parent), ["out", os.path.basename(staging), os.path.basename(mid_swap),
                                               os.path.basename(mid_swap) + ".old", ".other.hf2maxtext-tmp-x"])

  def test_publish_replaces_an_old_output_and_removes_it(self):
    parent = _scratch()
    output_dir, staging = os.path.join(parent, "out"), os.path.join(parent, ".out.tmp")
    os.makedirs(output_dir)
    os.makedirs(staging)
    with open(os.path.join(output_dir, "old.txt"), "w") as f:
      f.write("old")
    with open(os.path.join(staging, "config.json"), "w") as f:
      f.write("{}")
    local.LocalDisk(output_dir).publish(staging, ("config.json",))
    self.assertEqual(os.listdir(output_dir), ["config.json"])
    self.assertEqual(sorted(os.listdir(parent)), ["out"])


class StepTest(absltest.TestCase):

  def test_unfinished_and_committed_steps(self):
    disk = local.LocalDisk(_scratch())
    self.assertEqual(disk.unfinished_steps(), [])
    os.makedirs(os.path.join(disk.path, "0.orbax-checkpoint-tmp-99"))
    self.assertEqual(disk.unfinished_steps(), [os.path.join(disk.path, "0.orbax-checkpoint-tmp-99")])
    self.assertFalse(disk.has_committed_step())
    os.makedirs(os.path.join(disk.path, "0"))
    self.assertTrue(disk.has_committed_step())


class JournalTest(absltest.TestCase):

  def test_entries_are_lines_and_close_syncs(self):
    path = os.path.join(_scratch(), "gen-0.journal")
    journal = local.LocalJournal(path)
    synced = []
    real_fsync = os.fsync
    with mock.patch.object(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))):
      journal(BlockWritten("params.params.a", (0, 0), (2, 4), 32))
      journal(BlockWritten("params.params.b", (2,), (4,), 8))
      journal.close()
      journal.close()  # Twice is harmless.
    self.assertNotEqual(synced, [])
    with open(path) as f:
      lines = [json.loads(line) for line in f]
    self.assertEqual(lines, [{"a": "params.params.a", "s": [0, 0], "e": [2, 4]},
                             {"a": "params.params.b", "s": [2], "e": [4]}])


if __name__ == "__main__":
  absltest.main()
