"""The built binaries run on their own: `bazel-bin/converter/converter` (and tools/validate, tools/benchmark) from
another directory with a minimal environment (PATH=/usr/bin:/bin, nothing else), as production scripts call them;
the launcher's interpreter (tools/python3) finds the workspace's .venv by itself."""

from __future__ import annotations

import os
import subprocess

from absl.testing import absltest

from integration_tests import harness

harness.start_jax()

from tools import checkpoint_io  # pylint: disable=g-import-not-at-top

_MINIMAL_ENV = {"PATH": "/usr/bin:/bin"}


def _launcher(package: str, name: str) -> str:
  """The binary's launcher: in this test's runfiles under Bazel (a data dependency), else in bazel-bin/."""
  candidates = [os.path.join(os.getcwd(), package, name), os.path.join(harness.REPO_ROOT, "bazel-bin", package, name)]
  for candidate in candidates:
    if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
      return os.path.abspath(candidate)
  raise AssertionError(f"no built {package}/{name} in {candidates}: run `tools/bazel build //{package}:{name}`")


class BuiltBinaryTest(absltest.TestCase):

  def run_alone(self, launcher: str, *flags: str, returncode: int = 0,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    elsewhere = harness.scratch_dir("elsewhere-")
    result = subprocess.run([launcher, *flags], cwd=elsewhere, env=dict(_MINIMAL_ENV, **(env or {})),
                            capture_output=True, text=True, timeout=600)
    self.assertEqual(result.returncode, returncode, f"{launcher} {' '.join(flags)}:\n{result.stderr[-3000:]}")
    self.assertNotIn("ModuleNotFoundError", result.stderr)
    return result

  def test_converter_and_validator_run_with_a_minimal_environment(self):
    model = os.path.join(harness.REPO_ROOT, "testdata", "tiny-qwen3")
    out = os.path.join(harness.scratch_dir("built-"), "out")
    result = self.run_alone(_launcher("converter", "converter"), f"--hf_model_path={model}",
                            f"--output_dir={out}", "--simulated_cpu_devices_count=1", "--save_dtype=float32",
                            "--noprogress", "--verify")
    self.assertIn(", 0 mismatches", result.stdout)
    reference = os.path.join(harness.scratch_dir("built-ref-"), "out")
    harness.run_converter(f"--hf_model_path={model}", f"--output_dir={reference}", "--simulated_cpu_devices_count=1",
                          "--save_dtype=float32", "--noprogress")
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(f"{out}/0/items"),
                                                       checkpoint_io.restore_v0(f"{reference}/0/items")), [])
    # On an accelerator suite this process holds the chip (a TPU admits one process), so the validator, which
    # opens JAX's default backend, keeps to the CPU.
    validated = self.run_alone(_launcher("tools", "validate"), f"--hf_model_path={model}",
                               f"--checkpoint={out}/0/items",
                               env=None if harness.test_platform() == "cpu" else {"JAX_PLATFORMS": "cpu"})
    self.assertIn("PASSED", validated.stdout)

  def test_benchmark_starts_with_a_minimal_environment(self):
    # Its flags are defined next to imports of numpy, ml_dtypes and tools/: --help (absl exits 1 after it) needs
    # them all. A real run needs gigabytes; the README has its figures.
    result = self.run_alone(_launcher("tools", "benchmark"), "--help", returncode=1)
    self.assertIn("--size_gb", result.stdout + result.stderr)


if __name__ == "__main__":
  absltest.main()
