"""Killed or interrupted mid-save: nothing committed; `--resume` finishes byte-for-byte what a clean run writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from absl.testing import absltest, parameterized

from integration_tests import fixtures, harness

harness.start_jax()

from tools import checkpoint_io  # pylint: disable=g-import-not-at-top

JOURNAL_DIR = "0.hf2maxtext-resume"


def _journaled_blocks(out: str) -> int:
  directory = os.path.join(out, JOURNAL_DIR)
  if not os.path.isdir(directory):
    return 0
  total = 0
  for name in os.listdir(directory):
    if name.endswith(".journal"):
      with open(os.path.join(directory, name)) as f:
        total += sum(1 for _ in f)
  return total


class InterruptionTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = fixtures.write_moe("interrupt-hf-", fixtures.STREAMED_MOE)  # Dozens of writes to interrupt.
    cls.reference = os.path.join(harness.scratch_dir("clean-"), "out")
    harness.run_converter(*cls.flags(cls.reference))

  @classmethod
  def flags(cls, out: str, *extra: str) -> list[str]:
    return [f"--hf_model_path={cls.model}", f"--output_dir={out}", "--simulated_cpu_devices_count=1",
            fixtures.STREAMING_BUDGET, "--noprogress", *extra]

  def _start_and_stop(self, out: str, sig: int, flags: list[str] | None = None) -> subprocess.CompletedProcess:
    """Starts a conversion (`flags`, default `self.flags(out)`), waits until some blocks are durably written, then
    sends `sig`.

    The conversion runs niced: on a busy machine (CI runs two tests at a time) it otherwise went on to its last
    block while this process waited for the CPU to look at the journal, and a SIGINT then came too late.
    """
    env = harness.converter_env()
    child = subprocess.Popen(["nice", "-n", "10", sys.executable, harness.CONVERTER_MAIN, *(flags or self.flags(out))],
                             env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while _journaled_blocks(out) < 8 and child.poll() is None and time.monotonic() < deadline:
      time.sleep(0.01)
    self.assertIsNone(child.poll(), "the conversion finished before it could be interrupted")
    child.send_signal(sig)
    stdout, stderr = child.communicate(timeout=300)
    return subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)

  @parameterized.named_parameters(("sigkill", signal.SIGKILL), ("sigint", signal.SIGINT))
  def test_interrupt_commits_nothing_and_resume_finishes_identically(self, sig):
    out = os.path.join(harness.scratch_dir("interrupted-"), "out")
    stopped = self._start_and_stop(out, sig)
    self.assertNotEqual(stopped.returncode, 0)
    self.assertEqual(harness.committed_files(out), [])
    journaled = _journaled_blocks(out)
    self.assertGreater(journaled, 0)
    if sig == signal.SIGINT:
      self.assertIn("--resume", stopped.stderr)

    resumed = harness.run_converter(*self.flags(out, "--resume", "--verify"))
    # The blocks the resumed save took from the interrupted one: every journaled block (a line torn by the kill
    # aside), counted as read.
    reused = int(resumed.stdout.split("resumed:")[1].split()[0])
    self.assertBetween(reused, journaled - 1, journaled)
    self.assertIn(", 0 mismatches", resumed.stdout)
    self.assertFalse(os.path.exists(os.path.join(out, JOURNAL_DIR)))
    diffs = checkpoint_io.trees_bit_identical(
        checkpoint_io.restore_v0(os.path.join(out, "0", "items")),
        checkpoint_io.restore_v0(os.path.join(self.reference, "0", "items")),
    )
    self.assertEqual(diffs, [])

  def test_a_maxtext_checkpoint_laid_out_again_resumes_identically(self):
    # For a mesh of 4 hosts: each host's part in databases of its own, journaled and salvaged piece by piece.
    relayout = lambda out, *extra: [f"--checkpoint_path={self.reference}/0/items", f"--output_dir={out}",
                                    "--scan_layers=false", "--simulated_cpu_devices_count=1", "--target_mesh=fsdp=16",
                                    fixtures.STREAMING_BUDGET, "--noprogress", *extra]
    clean = os.path.join(harness.scratch_dir("relaid-clean-"), "out")
    harness.run_converter(*relayout(clean))
    out = os.path.join(harness.scratch_dir("relaid-interrupted-"), "out")
    self._start_and_stop(out, signal.SIGKILL, relayout(out))
    self.assertEqual(harness.committed_files(out), [])
    resumed = harness.run_converter(*relayout(out, "--resume", "--verify"))
    self.assertGreater(int(resumed.stdout.split("resumed:")[1].split()[0]), 0)
    self.assertIn(", 0 mismatches", resumed.stdout)
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(os.path.join(out, "0", "items")),
                                                       checkpoint_io.restore_v0(os.path.join(clean, "0", "items"))),
                     [])

  def test_resume_refuses_changed_inputs(self):
    out = os.path.join(harness.scratch_dir("changed-"), "out")
    self._start_and_stop(out, signal.SIGKILL)
    result = harness.run_converter(*self.flags(out, "--resume", "--save_dtype=float32"), check=False)
    self.assertEqual(result.returncode, 1)
    self.assertIn("cannot resume", result.stderr)
    self.assertEqual(harness.committed_files(out), [])


if __name__ == "__main__":
  absltest.main()
