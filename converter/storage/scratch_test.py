"""A scratch directory outlives its owner only until the next sweep: kept while the owner lives (its flock held),
removed once it is dead; other hosts', other programs' and plain files are left alone."""

import os
import subprocess
import sys

from absl.testing import absltest

from converter.storage import scratch


class ScratchTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.parent = self.create_tempdir().full_path

  def test_a_live_owners_directory_is_kept_and_released_on_request(self):
    claimed = scratch.claim("hub", self.parent)
    self.assertRegex(os.path.basename(claimed.path), rf"^hf2maxtext-hub-{os.getpid()}@")
    with open(os.path.join(claimed.path, "model-00001-of-00002.safetensors"), "wb") as f:
      f.write(b"staged")
    self.assertEqual(scratch.sweep(self.parent), [])
    self.assertTrue(os.path.exists(claimed.path))
    claimed.release()
    self.assertFalse(os.path.exists(claimed.path))
    claimed.release()  # Twice is harmless (publish, then a failure's cleanup).

  def test_a_killed_owners_directory_is_removed_by_the_next_claim(self):
    child = subprocess.run(
        [sys.executable, "-c", "import os, sys; from converter.storage import scratch;"
         f" d = scratch.claim('hub', {self.parent!r}); open(os.path.join(d.path, 'shard'), 'wb').write(b'x');"
         " print(d.path); sys.stdout.flush(); os._exit(0)"],  # Dies without cleaning up, as SIGKILL would.
        capture_output=True, text=True, check=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    left = child.stdout.strip()
    self.assertTrue(os.path.exists(os.path.join(left, "shard")))
    with scratch.directory("validate", self.parent) as mine:
      self.assertFalse(os.path.exists(left))
      self.assertEqual(os.listdir(self.parent), [os.path.basename(mine)])
    self.assertEqual(os.listdir(self.parent), [])

  def test_what_is_not_a_dead_runs_directory_of_this_host_is_left(self):
    this_host = scratch._host()  # pylint: disable=protected-access
    kept = ["hf2maxtext-hub-1@another-host-abcd", "hf2maxtext-hub-abcd", "other-tmp", f"hf2maxtext-hub-2@{this_host}-f"]
    for name in kept[:3]:
      os.mkdir(os.path.join(self.parent, name))
    with open(os.path.join(self.parent, kept[3]), "w") as f:
      f.write("a file, not a directory")
    self.assertEqual(scratch.sweep(self.parent), [])
    self.assertCountEqual(os.listdir(self.parent), kept)


if __name__ == "__main__":
  absltest.main()
