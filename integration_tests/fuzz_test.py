"""A seeded sample of tools/fuzz_inputs.py through its binary: damaged checkpoints in every direction, each
converted or refused by name, none a failure (docs/fuzzing.md; the full runs are in docs/fuzzing-results.md)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

from absl.testing import absltest

from integration_tests import harness

SEED = 295  # Its 48 trials reach both classes in every direction (13 of them relayouts).
TRIALS = 48


class FuzzTest(absltest.TestCase):

  def test_a_seeded_sample_has_no_failures(self):
    work_dir = harness.scratch_dir("fuzz-")
    result = subprocess.run(
        [sys.executable, os.path.join(harness.REPO_ROOT, "tools", "fuzz_inputs.py"), f"--seed={SEED}",
         f"--trials={TRIALS}", f"--work_dir={work_dir}"],
        env=harness.converter_env(), capture_output=True, text=True, timeout=600, check=False)
    self.assertEqual(result.returncode, 0, result.stderr[-4000:])
    with open(os.path.join(work_dir, "outcomes.jsonl")) as f:
      outcomes = [json.loads(line) for line in f]
    self.assertLen(outcomes, TRIALS)
    failures = [o for o in outcomes if o["cls"] not in ("converted", "refused")]
    self.assertEqual(failures, [], result.stdout[-6000:])
    # Not vacuous: every direction ran, and each both converted and refused some of its inputs.
    reached = collections.Counter((o["trial"]["direction"], o["cls"]) for o in outcomes)
    for direction in ("to_maxtext", "to_huggingface", "relayout"):
      for cls in ("converted", "refused"):
        self.assertGreater(reached[(direction, cls)], 0, (direction, cls, reached))
    self.assertEqual(os.listdir(os.path.join(work_dir, "trials")), [])  # Each trial's files removed once judged.


if __name__ == "__main__":
  absltest.main()
