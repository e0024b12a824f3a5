"""A run directory's steps, local and in a bucket: which are committed, which one --step names."""

import os
import tempfile

from absl.testing import absltest

from converter import storage
from converter.checkpoint_format import layout, steps
from converter.errors import ConversionError
from tools.gcs_emulator import GcsEmulator


def _write(path: str, text: str = "{}") -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write(text)


def _run_dir(*names: str) -> str:
  """A run directory holding a step's items (a tree's _METADATA) under each of `names`."""
  run = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
  for name in names:
    _write(os.path.join(run, name, layout.ITEMS, layout.TREE_METADATA))
  return run


class LocalStepsTest(absltest.TestCase):

  def test_latest_is_the_highest_step_and_orbax_temporary_directories_are_not_steps(self):
    run = _run_dir("100", "300", "20", "400.orbax-checkpoint-tmp-1712345678", "notes")
    self.assertEqual([s.number for s in steps.run_steps(run)], [20, 100, 300])
    self.assertEqual(steps.checkpoint_of(run), os.path.join(run, "300"))
    self.assertEqual(steps.checkpoint_of(run, "100", step_given=True), os.path.join(run, "100"))

  def test_a_missing_step_is_refused_listing_the_steps_present(self):
    run = _run_dir("100", "300")
    with self.assertRaisesRegex(ConversionError, r"no step 200; steps present: 100, 300"):
      steps.checkpoint_of(run, "200", step_given=True)
    with self.assertRaisesRegex(ConversionError, r"--step='last': expected latest or a step number"):
      steps.checkpoint_of(run, "last", step_given=True)

  def test_maxtexts_run_directory_keeps_its_steps_under_checkpoints(self):
    run = _run_dir("checkpoints/5", "checkpoints/10")
    self.assertEqual(steps.checkpoint_of(run), os.path.join(run, "checkpoints", "10"))

  def test_a_step_or_items_directory_is_taken_as_it_is_and_step_is_refused_with_it(self):
    run = _run_dir("0")
    for path in (os.path.join(run, "0"), os.path.join(run, "0", "items")):
      self.assertEqual(steps.checkpoint_of(path), path)
      with self.assertRaisesRegex(ConversionError, "one step's checkpoint already"):
        steps.checkpoint_of(path, "0", step_given=True)

  def test_a_path_without_steps_is_left_to_the_reader(self):
    empty = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    self.assertEqual(steps.checkpoint_of(empty), empty)
    self.assertEqual(steps.checkpoint_of(empty + "/missing"), empty + "/missing")
    with self.assertRaisesRegex(ConversionError, "holds no steps"):
      steps.checkpoint_of(empty, "3", step_given=True)


class BucketStepsTest(absltest.TestCase):

  def test_only_a_step_with_its_commit_marker_is_committed(self):
    gcs = GcsEmulator()
    gcs.start()
    self.addCleanup(gcs.stop)
    gcs.create_bucket("run")
    environ = dict(os.environ)
    self.addCleanup(lambda: (os.environ.clear(), os.environ.update(environ)))
    os.environ.update(gcs.env)
    storage.configure_emulator()
    storage.set_request_retries(0)
    for step in ("1", "2", "3"):
      storage.write_text(f"gs://run/r/{step}/items/_METADATA", "{}")
    for step in ("1", "2"):
      storage.write_text(f"gs://run/r/{step}/{layout.COMMIT_MARKER}", "")
    self.assertEqual([s.describe() for s in steps.run_steps("gs://run/r")], ["1", "2", "3 (uncommitted)"])
    self.assertEqual(steps.checkpoint_of("gs://run/r"), "gs://run/r/2")
    self.assertEqual(steps.checkpoint_of("gs://run/r", "3", step_given=True), "gs://run/r/3")
    storage.delete(f"gs://run/r/1/{layout.COMMIT_MARKER}")
    storage.delete(f"gs://run/r/2/{layout.COMMIT_MARKER}")
    with self.assertRaisesRegex(ConversionError, r"no committed step \(steps present: 1 \(uncommitted\)"):
      steps.checkpoint_of("gs://run/r")


if __name__ == "__main__":
  absltest.main()
