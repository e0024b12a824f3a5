"""Shared by the integration tests: run the real converter binary in a child process, pick the platform."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from typing import Any

import converter

CONVERTER_MAIN = os.path.join(os.path.dirname(converter.__file__), "main.py")
REPO_ROOT = os.path.dirname(os.path.dirname(converter.__file__))


def test_platform() -> str:
  """cpu, gpu or tpu: the `*_gpu` / `*_tpu` test targets set HF2MAXTEXT_TEST_PLATFORM."""
  return os.environ.get("HF2MAXTEXT_TEST_PLATFORM", "cpu")


def start_jax() -> None:
  """Validation (restores, forward pass) runs on the suite's platform; one device is enough for it."""
  import jax  # pylint: disable=g-import-not-at-top

  platform = test_platform()
  jax_platform = {"gpu": "cuda"}.get(platform, platform)
  jax.config.update("jax_platforms", jax_platform)
  if platform == "cpu":
    jax.config.update("jax_num_cpu_devices", 1)
    return
  try:
    jax.devices(jax_platform)
  except Exception as e:  # pylint: disable=broad-except  (without a CUDA plugin JAX raises a bare AssertionError)
    package = "jax[cuda12]" if platform == "gpu" else "jax[tpu]"
    reason = str(e).strip().splitlines()[0] if str(e).strip() else f"JAX has no {jax_platform} backend: is {package} installed?"
    sys.exit(f"hf2maxtext: the {platform} suite needs a {platform.upper()} visible to JAX, and there is none"
             f" ({reason}); on a {platform.upper()} runner: HF2MAXTEXT_PLATFORM={platform} tools/bazel test"
             f" //integration_tests:{platform}_tests")


def scratch_dir(prefix: str) -> str:
  return tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TEST_TMPDIR"))


def converter_env(**extra: str) -> dict[str, str]:
  """The environment a converter child process runs in: this one's, the repository importable, `extra` added,
  and no test-platform marker (the converter runs on the CPU as a user runs it)."""
  env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)
  env.pop("HF2MAXTEXT_TEST_PLATFORM", None)
  return env


def converter_command(*flags: str) -> list[str]:
  return [sys.executable, CONVERTER_MAIN, *flags]


def run_converter(*flags: str, check: bool = True) -> subprocess.CompletedProcess:
  """`bazel run //converter -- FLAGS` as a user runs it, in a fresh process (JAX's device count is per process)."""
  result = subprocess.run(converter_command(*flags), env=converter_env(), capture_output=True, text=True,
                          timeout=900)
  if check and result.returncode != 0:
    raise AssertionError(f"converter {' '.join(flags)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
  return result


def assert_refused(test: Any, model_dir: str, *expected: str, flags: tuple[str, ...] = (),
                   out: str | None = None) -> str:
  """Converting `model_dir` exits 1 with exactly one `error:` line holding every `expected` text, no traceback and
  nothing that looks committed; returns that line."""
  out = out or scratch_dir("out-")
  result = run_converter(f"--hf_model_path={model_dir}", f"--output_dir={out}", "--simulated_cpu_devices_count=1",
                         *flags, check=False)
  test.assertEqual(result.returncode, 1, result.stderr[-2000:])
  error_lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  test.assertLen(error_lines, 1, result.stderr[-2000:])
  for text in expected:
    test.assertIn(text, error_lines[0])
  test.assertNotIn("Traceback", result.stderr)
  test.assertEqual(committed_files(out), [])
  return error_lines[0]


def committed_files(output_dir: str) -> list[str]:
  """What would make a reader take `output_dir` for a finished checkpoint: a step directory or a commit file."""
  found = [os.path.join(d, f) for d, _, fs in os.walk(output_dir) for f in fs if f == "commit_success.txt"]
  if os.path.exists(os.path.join(output_dir, "0")):
    found.append(os.path.join(output_dir, "0"))
  return found
