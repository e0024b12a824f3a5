"""Resume bookkeeping: which journaled blocks are salvaged from which generation, a torn journal line, the
generations nothing refers to any more, and the next generation's journal."""

import json
import os
import tempfile
from unittest import mock

import numpy as np
import tensorstore as ts
from absl.testing import absltest

from converter import conversion
from converter.options import PlanOptions
from converter.output import resume
from converter.output.local import LocalDisk
from handlers import Processes


def _generation(directory: str, number: int, entries: list[str], processes: tuple[int, ...] = (0,)) -> None:
  """A parked generation: its journal lines and an OCDBT database per process (empty: only its place matters)."""
  for process in processes:
    os.makedirs(os.path.join(directory, f"gen-{number}", "items", f"ocdbt.process_{process}"))
  with open(os.path.join(directory, f"gen-{number}.journal"), "w") as f:
    f.write("".join(entries))


def _entry(array: str, start: list[int], stop: list[int]) -> str:
  return json.dumps({"a": array, "s": start, "e": stop}) + "\n"


class ResumeTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.plan = conversion.plan_conversion("testdata/tiny-qwen3", PlanOptions())

  def _resume_dir(self) -> tuple[LocalDisk, str]:
    disk = LocalDisk(tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir()))
    directory = resume.resume_dir(disk.path)
    os.makedirs(directory)
    with open(os.path.join(directory, "fingerprint.json"), "w") as f:
      json.dump(resume.fingerprint(self.plan), f)
    return disk, directory

  def test_newer_generations_override_older_ones_and_a_torn_line_ends_a_journal(self):
    disk, directory = self._resume_dir()
    _generation(directory, 0, [_entry("params.params.a", [0], [2]), _entry("params.params.b", [0], [4])])
    _generation(directory, 1, [_entry("params.params.a", [0], [2]), '{"a": "params.params.c", "s": [0'])
    salvage, journal = resume.prepare(disk, self.plan, resume=True)
    journal.close()
    gen = lambda n: os.path.join(directory, f"gen-{n}", "items", "ocdbt.process_0")
    self.assertEqual({key: where.root for key, where in salvage.blocks.items()},
                     {("params.params.a", ((0,), (2,))): gen(1), ("params.params.b", ((0,), (4,))): gen(0)})
    self.assertEqual(journal.path, os.path.join(directory, "gen-2.journal"))

  def test_generations_nothing_refers_to_are_deleted(self):
    disk, directory = self._resume_dir()
    _generation(directory, 0, [_entry("params.params.a", [0], [2])])
    _generation(directory, 1, [_entry("params.params.a", [0], [2])])
    _, journal = resume.prepare(disk, self.plan, resume=True)
    journal.close()
    self.assertFalse(os.path.exists(os.path.join(directory, "gen-0")))
    self.assertTrue(os.path.exists(os.path.join(directory, "gen-1")))

  def test_without_resume_the_directory_starts_empty(self):
    disk, directory = self._resume_dir()
    _generation(directory, 0, [_entry("params.params.a", [0], [2])])
    salvage, journal = resume.prepare(disk, self.plan, resume=False)
    journal.close()
    self.assertEqual(salvage.blocks, {})
    self.assertEqual(sorted(os.listdir(directory)), ["fingerprint.json", "gen-0.journal"])

  def test_each_process_journals_apart(self):
    path = resume.journal_path("/out", 3, Processes(index=1, count=2))
    self.assertEqual(path, "/out/0.hf2maxtext-resume/gen-3.process-1.journal")
    self.assertEqual(resume.journal_path("/out", 3, Processes()), "/out/0.hf2maxtext-resume/gen-3.journal")

  def test_salvaged_blocks_replace_only_their_leaves_loaders(self):
    leaf = self.plan.leaves[0]
    name = ".".join(("params", "params", *leaf.path))
    block = (tuple(0 for _ in leaf.shape), tuple(leaf.shape))
    salvaged = resume.with_salvage(self.plan, resume.Salvage({(name, block): resume.Salvaged("/r", "/r")}))
    self.assertIsInstance(salvaged.leaves[0].loader, resume.SalvagingLoader)
    self.assertEqual(salvaged.leaves[1:], self.plan.leaves[1:])
    self.assertEqual(salvaged.leaves[0].loader.source_tensors(), leaf.loader.source_tensors())

  def test_only_the_blocks_actually_taken_are_counted(self):
    leaf = self.plan.leaves[0]
    name = ".".join(("params", "params", *leaf.path))
    whole = tuple(slice(0, n) for n in leaf.shape)
    salvage = resume.Salvage({(name, (tuple(0 for _ in leaf.shape), tuple(leaf.shape))): resume.Salvaged("/r", "/r")})
    loader = resume.with_salvage(self.plan, salvage).leaves[0].loader
    np.testing.assert_array_equal(loader.region(whole), leaf.loader.region(whole))  # Lost: recomputed.
    self.assertEqual(salvage.reused.count, 0)
    stored = np.full(leaf.shape, 3, leaf.dtype)
    with mock.patch.object(resume, "_open_salvaged", return_value=ts.array(stored)):
      np.testing.assert_array_equal(loader.region(whole), stored)
      loader.region(tuple(slice(0, 1) for _ in leaf.shape))  # Not a journaled block: recomputed.
    self.assertEqual(salvage.reused.count, 1)


class MovedRevisionTest(absltest.TestCase):
  """A Hub repo read at one commit, its revision naming another when resumed: the commit to pass is said."""

  def test_the_commit_read_is_named(self):
    read = lambda commit: {"inputs": [[f"hf://o/n@{commit}/model.safetensors", 10, f"{commit}:e"]], "plan": "p"}
    moved = resume._moved_revision  # pylint: disable=protected-access
    said = moved(read("a" * 40), read("b" * 40))
    self.assertIn(f"o/n was read at commit {'a' * 40}, and the revision now names {'b' * 40}", said)
    self.assertIn(f"pass --revision={'a' * 40} with --resume", said)
    self.assertIsNone(moved(read("a" * 40), {**read("a" * 40), "plan": "q"}))
    self.assertIsNone(moved({"inputs": [["/m/model.safetensors", 1, "1"]]}, {"inputs": []}))


if __name__ == "__main__":
  absltest.main()
