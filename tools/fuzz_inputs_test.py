"""tools/fuzz_inputs.py: trials are a function of their seed, and every way a run can go wrong is classified as
such (planted by fake converters run through the fuzzer's own fork server)."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time

from absl.testing import absltest

from tools import fuzz_damage
from tools import fuzz_inputs


def _files(root: str) -> dict[str, bytes]:
  found = {}
  for directory, _, names in os.walk(root):
    for name in names:
      with open(os.path.join(directory, name), "rb") as f:
        found[os.path.relpath(os.path.join(directory, name), root)] = f.read()
  return found


# Fake converters, each run in a forked child as the converter's main is: what they do to their output and stderr.
def _refuse(argv: list[str]) -> int:
  inputs = argv[0].split("=", 1)[1]
  print(f"error: {inputs}/config.json: 'hidden_size' must be a positive integer", file=sys.stderr)
  return 1


def _refuse_naming_nothing(argv: list[str]) -> int:
  del argv
  print("error: something went wrong", file=sys.stderr)
  return 1


def _raise(argv: list[str]) -> int:
  raise ValueError(f"unexpected {argv}")


def _allocate(argv: list[str]) -> int:
  del argv
  hoard = []
  for _ in range(64):
    hoard.append(bytearray(16 << 20))  # Touched: resident.
    time.sleep(0.01)
  return 0


def _hang(argv: list[str]) -> int:
  del argv
  time.sleep(60)
  return 0


def _segfault(argv: list[str]) -> int:
  del argv
  os.kill(os.getpid(), signal.SIGSEGV)
  return 0


def _leave_in_tmpdir(argv: list[str]) -> int:
  tempfile.mkstemp(prefix="staged-")
  return _refuse(argv)


def _refuse_after_finishing(argv: list[str]) -> int:
  output = argv[1].split("=", 1)[1]
  os.makedirs(os.path.join(output, "0", "items"))
  return _refuse(argv)


def _convert(argv: list[str]) -> int:
  output = argv[1].split("=", 1)[1]
  items = os.path.join(output, "0", "items")
  os.makedirs(items)
  for name, text in (("_METADATA", "{}"), ("manifest.ocdbt", ""), ("commit_success.txt", "")):
    with open(os.path.join(items, name), "w") as f:
      f.write(text)
  return 0


class FuzzInputsTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    cls.models = fuzz_inputs.Models(fuzz_inputs.build_hf_models(os.path.join(cls.root, "hf")), {})

  def test_a_trial_is_a_function_of_its_seed_and_index(self):
    self.assertEqual(fuzz_inputs.plan_trial(3, 17), fuzz_inputs.plan_trial(3, 17))
    trials = [fuzz_inputs.plan_trial(3, i) for i in range(200)]
    self.assertEqual({t.direction for t in trials}, {"to_maxtext", "to_huggingface", "relayout"})
    self.assertEqual({t.model for t in trials if t.direction == "to_maxtext"}, set(self.models.hf))
    self.assertNotEqual(trials[:20], [fuzz_inputs.plan_trial(4, i) for i in range(20)])

  def test_the_same_trial_damages_the_same_bytes(self):
    hf_trials = [t for t in (fuzz_inputs.plan_trial(5, i) for i in range(60)) if t.direction == "to_maxtext"]
    for trial in hf_trials[:25]:
      copies = []
      for _ in range(2):
        directory = tempfile.mkdtemp(dir=self.root)
        argv, damage = fuzz_inputs.prepare_trial(trial, self.models, directory)
        copies.append((damage, _files(os.path.join(directory, "input")), [a.replace(directory, "") for a in argv]))
      self.assertEqual(copies[0], copies[1], trial)
      self.assertNotEqual(copies[0][1], _files(self.models.hf[trial.model]), trial)  # Something was damaged.

  def test_huge_claims_reach_the_layer_count(self):
    claims = [fuzz_damage.claim_huge_size({"num_hidden_layers": 2, "hidden_size": 8}, fuzz_damage.random.Random(i))
              for i in range(20)]
    self.assertTrue(any(c.startswith("num_hidden_layers") for c in claims), claims)

  def _run(self, entry, *, memory_limit_mb: int = 1024, timeout_s: float = 30, must_refuse: bool = False,
           stored_values: bool = False, direction: str = "to_maxtext", reference: str | None = None):
    """(class, reason) of `entry` run as a trial's converter on a copy of the dense model."""
    directory = tempfile.mkdtemp(dir=self.root)

    def prepare(path: str) -> list[str]:
      fuzz_damage.copy_tree(self.models.hf["dense"], os.path.join(path, "input"))
      with open(os.path.join(path, "damage.json"), "w") as f:
        json.dump({"file": "config.json", "kind": "planted", "detail": "", "stored_values": stored_values,
                   "must_refuse": must_refuse}, f)
      return [f"--hf_model_path={os.path.join(path, 'input')}", f"--output_dir={os.path.join(path, 'output')}"]

    runner = fuzz_inputs.Runner(entry, memory_limit_bytes=memory_limit_mb << 20, timeout_s=timeout_s, jobs=1)
    [(_, finished)] = list(runner.run([fuzz_inputs.Job("planted", directory, prepare)]))
    return fuzz_inputs.classify(fuzz_inputs.observe(directory, finished, direction, reference))

  def test_a_named_refusal_and_a_conversion_pass(self):
    cls, reason = self._run(_refuse)
    self.assertEqual(cls, "refused")
    self.assertIn("hidden_size", reason)
    self.assertEqual(self._run(_convert), ("converted", ""))

  def test_planted_failures_are_classified(self):
    self.assertEqual(self._run(_raise)[0], "traceback")
    self.assertIn("ValueError", self._run(_raise)[1])
    self.assertEqual(self._run(_refuse_naming_nothing)[0], "unnamed")
    self.assertEqual(self._run(_segfault), ("crash", "signal SIGSEGV"))
    self.assertEqual(self._run(_leave_in_tmpdir)[0], "left_behind")
    self.assertEqual(self._run(_refuse_after_finishing)[0], "left_behind")
    self.assertEqual(self._run(_convert, must_refuse=True)[0], "silent")

  def test_the_memory_guard_and_the_time_limit_kill(self):
    cls, reason = self._run(_allocate, memory_limit_mb=256)
    self.assertEqual(cls, "memory", reason)
    start = time.monotonic()
    self.assertEqual(self._run(_hang, timeout_s=1)[0], "timeout")
    self.assertLess(time.monotonic() - start, 10)

  def test_values_the_way_back_changed_are_silent(self):
    reference = tempfile.mkdtemp(dir=self.root)
    fuzz_inputs.write_hf_model(reference, {}, fuzz_inputs.model_tensors(fuzz_inputs.DENSE_CONFIG, "float32"))

    def write_back(seed: int):
      def entry(argv: list[str]) -> int:
        output = argv[1].split("=", 1)[1]
        fuzz_inputs.write_hf_model(output, {}, fuzz_inputs.model_tensors(fuzz_inputs.DENSE_CONFIG, "float32", seed))
        return 0
      return entry

    self.assertEqual(self._run(write_back(0), stored_values=True, direction="to_huggingface", reference=reference),
                     ("converted", ""))
    cls, reason = self._run(write_back(1), stored_values=True, direction="to_huggingface", reference=reference)
    self.assertEqual(cls, "silent")
    self.assertIn("differs from the intact checkpoint's", reason)


if __name__ == "__main__":
  absltest.main()
