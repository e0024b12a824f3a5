"""The local flavour of the output lock (the bucket lease runs against a real GCS endpoint in
integration_tests/one_writer_test.py, two real conversions in both)."""

import json
import os
import subprocess
import sys
import textwrap

from absl.testing import absltest

from converter.output import local
from converter.output import lock as output_lock
from converter.errors import ConversionError


class LocalLockTest(absltest.TestCase):

  def test_second_holder_is_refused_while_the_first_holds_it(self):
    out = os.path.join(self.create_tempdir().full_path, "out")
    with output_lock.hold(local.LocalDisk(out)):
      record = json.load(open(output_lock.lock_path(out)))
      self.assertEqual(record["pid"], os.getpid())
      # flock is per open file: another process (not another open in this one) must be refused.
      child = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
          from converter.output import lock as output_lock
          from converter.output import local
          with output_lock.hold(local.LocalDisk({out!r})):
            pass
          """)], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.getcwd()), timeout=60)
      self.assertNotEqual(child.returncode, 0)
      self.assertIn(f"{out}: another conversion is writing there (pid {os.getpid()}", child.stderr)
    self.assertFalse(os.path.exists(output_lock.lock_path(out)))
    with output_lock.hold(local.LocalDisk(out)):  # Released: free again.
      pass

  def test_a_lock_file_nobody_holds_is_taken(self):
    out = os.path.join(self.create_tempdir().full_path, "out")
    with open(output_lock.lock_path(out), "w") as f:
      f.write("{not json")
    with output_lock.hold(local.LocalDisk(out)):
      self.assertEqual(json.load(open(output_lock.lock_path(out)))["pid"], os.getpid())

  def test_parent_directory_is_created(self):
    out = os.path.join(self.create_tempdir().full_path, "a", "b", "out")
    with output_lock.hold(local.LocalDisk(out)):
      self.assertTrue(os.path.exists(output_lock.lock_path(out)))

  def test_refusal_names_an_unreadable_holder(self):
    out = os.path.join(self.create_tempdir().full_path, "out")
    lock = local.LocalLock(output_lock.lock_path(out))
    with open(lock.path, "w") as f:
      f.write("garbage")
    self.assertIn("holder unknown", lock._refusal())  # pylint: disable=protected-access
    self.assertIsInstance(ConversionError(lock._refusal()), ConversionError)  # pylint: disable=protected-access


if __name__ == "__main__":
  absltest.main()
