"""One writer per output: a second conversion into an output being written refuses at once, naming it, and the
first one completes untouched; a dead conversion's lock does not block the next one. Local disks and buckets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from absl.testing import absltest, parameterized

from tools import gcs_emulator
from integration_tests import fixtures, harness

harness.start_jax()

from tools import checkpoint_io  # pylint: disable=g-import-not-at-top

LOCK_SUFFIX = ".hf2maxtext-lock"


class OneWriterTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # The first conversion is still writing when the second one starts.
    cls.model = fixtures.write_moe("one-writer-hf-", fixtures.STREAMED_MOE)
    cls.reference = os.path.join(harness.scratch_dir("one-writer-ref-"), "out")
    harness.run_converter(*cls.flags(cls.reference))
    cls.gcs = gcs_emulator.GcsEmulator()
    cls.gcs.start()
    cls.gcs.create_bucket("ckpts")

  @classmethod
  def tearDownClass(cls):
    cls.gcs.stop()
    super().tearDownClass()

  @classmethod
  def flags(cls, out: str) -> list[str]:
    return [f"--hf_model_path={cls.model}", f"--output_dir={out}", "--simulated_cpu_devices_count=1",
            fixtures.STREAMING_BUDGET, "--noprogress"]

  def env(self) -> dict[str, str]:
    return harness.converter_env(**self.gcs.env)

  def output(self, where: str, name: str) -> str:
    return os.path.join(harness.scratch_dir("one-writer-"), name) if where == "local" else f"gs://ckpts/{name}"

  def lock_exists(self, out: str) -> bool:
    if out.startswith("gs://"):
      return f"{out[len('gs://ckpts/'):]}{LOCK_SUFFIX}" in self.gcs.object_names("ckpts")
    return os.path.exists(out + LOCK_SUFFIX)

  def restored(self, out: str):
    if out.startswith("gs://"):
      copy = os.path.join(harness.scratch_dir("one-writer-copy-"), "out")
      self.gcs.download_dir("ckpts", out[len("gs://ckpts/"):], copy)
      out = copy
    return checkpoint_io.restore_v0(os.path.join(out, "0", "items"))

  @parameterized.parameters("local", "bucket")
  def test_second_conversion_refuses_and_first_completes(self, where):
    out = self.output(where, "shared")
    first = subprocess.Popen(harness.converter_command(*self.flags(out)), env=self.env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not self.lock_exists(out) and first.poll() is None and time.monotonic() < deadline:
      time.sleep(0.05)
    self.assertIsNone(first.poll(), "the first conversion finished before the second could start")
    # Paused while the second one runs, so that it cannot finish first on a busy machine (a stalled writer,
    # which must be refused just the same).
    os.kill(first.pid, signal.SIGSTOP)
    try:
      started = time.monotonic()
      second = subprocess.run(harness.converter_command(*self.flags(out)), env=self.env(),
                              capture_output=True, text=True, timeout=300)
      refused_after = time.monotonic() - started
    finally:
      os.kill(first.pid, signal.SIGCONT)
    self.assertEqual(second.returncode, 1, second.stderr[-2000:])
    error = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
    self.assertLen(error, 1, second.stderr[-2000:])
    self.assertIn(f"{out}: another conversion is writing there", error[0])
    self.assertIn(f"pid {first.pid}", error[0])
    self.assertIn("stale" if where == "bucket" else "released by the system", error[0])
    self.assertIsNone(first.poll(), f"the second conversion took {refused_after:.1f} s to refuse")
    print(f"{where}: the second conversion refused after {refused_after:.1f} s")
    _, stderr = first.communicate(timeout=600)
    self.assertEqual(first.returncode, 0, stderr[-3000:])
    self.assertEqual(checkpoint_io.trees_bit_identical(self.restored(out), self.restored(self.reference)), [])
    self.assertFalse(self.lock_exists(out))

  def test_lock_file_of_a_dead_conversion_does_not_block(self):
    out = self.output("local", "after-crash")
    with open(out + LOCK_SUFFIX, "w") as f:  # What a killed conversion leaves: the file, but no flock on it.
      json.dump({"pid": 999999, "host": "elsewhere", "started": 0}, f)
    harness.run_converter(*self.flags(out))
    self.assertFalse(self.lock_exists(out))

  def test_stale_lease_in_a_bucket_is_taken_over(self):
    out = self.output("bucket", "stale-lease")
    record = {"holder": "dead", "pid": 999999, "host": "elsewhere", "started": time.time() - 3600,
              "renewed": time.time() - 600, "lease_s": 60}
    staging = harness.scratch_dir("one-writer-lock-")
    with open(os.path.join(staging, f"stale-lease{LOCK_SUFFIX}"), "w") as f:
      json.dump(record, f)
    self.gcs.upload_dir(staging, "ckpts", "")
    self.assertTrue(self.lock_exists(out))
    result = subprocess.run(harness.converter_command(*self.flags(out)), env=self.env(),
                            capture_output=True, text=True, timeout=600)
    self.assertEqual(result.returncode, 0, result.stderr[-2000:])
    self.assertIn("taking over a stale lock (pid 999999 on elsewhere", result.stderr)
    self.assertFalse(self.lock_exists(out))

  def test_holder_whose_lease_is_taken_over_stops_and_commits_nothing(self):
    out = self.output("bucket", "taken-over")
    env = dict(self.env(), HF2MAXTEXT_LOCK_LEASE_S="2")  # Renewed (and checked) every 0.5 s.
    holder = subprocess.Popen(harness.converter_command(*self.flags(out)), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not self.lock_exists(out) and holder.poll() is None and time.monotonic() < deadline:
      time.sleep(0.05)
    staging = harness.scratch_dir("one-writer-lock-")
    with open(os.path.join(staging, f"taken-over{LOCK_SUFFIX}"), "w") as f:
      json.dump({"holder": "newcomer", "pid": 777, "host": "other-host", "started": time.time(),
                 "renewed": time.time(), "lease_s": 60}, f)
    self.gcs.upload_dir(staging, "ckpts", "")
    self.assertIsNone(holder.poll(), "the conversion finished before its lease could be taken over")
    _, stderr = holder.communicate(timeout=300)
    self.assertEqual(holder.returncode, 1, stderr[-2000:])
    error = [line for line in stderr.splitlines() if line.startswith("error: ")]
    self.assertLen(error, 1, stderr[-2000:])
    self.assertIn("taken over by pid 777 on other-host", error[0])
    self.assertNotIn("taken-over/0/commit_success.txt", self.gcs.object_names("ckpts", "taken-over/"))

  def test_fresh_lease_in_a_bucket_refuses(self):
    out = self.output("bucket", "fresh-lease")
    record = {"holder": "alive", "pid": 4242, "host": "other-host", "started": time.time(), "renewed": time.time(),
              "lease_s": 60}
    staging = harness.scratch_dir("one-writer-lock-")
    with open(os.path.join(staging, f"fresh-lease{LOCK_SUFFIX}"), "w") as f:
      json.dump(record, f)
    self.gcs.upload_dir(staging, "ckpts", "")
    result = subprocess.run(harness.converter_command(*self.flags(out)), env=self.env(),
                            capture_output=True, text=True, timeout=300)
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertIn("pid 4242 on other-host", result.stderr)
    self.assertEqual([n for n in self.gcs.object_names("ckpts", "fresh-lease/")], [])


if __name__ == "__main__":
  absltest.main()
