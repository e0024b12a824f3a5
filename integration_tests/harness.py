"""Shared by the integration tests: run the real converter binary in a child process, pick the platform."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable, Sequence

from absl.testing import absltest

import converter
from tools.testing.reused_process import ReusedProcess

CONVERTER_MAIN = os.path.join(os.path.dirname(converter.__file__), "main.py")
REPO_ROOT = os.path.dirname(os.path.dirname(converter.__file__))

if not os.environ.get("TEST_TMPDIR"):  # Run as a plain script, not by Bazel: a scratch root removed at exit, so
  # that the scratch directories, emulators' roots and converter children (which inherit it) leave nothing behind.
  os.environ["TEST_TMPDIR"] = tempfile.mkdtemp(prefix="hf2maxtext-test-")
  atexit.register(shutil.rmtree, os.environ["TEST_TMPDIR"], ignore_errors=True)


def test_platform() -> str:
  """cpu, gpu or tpu: the `*_gpu` / `*_tpu` test targets set HF2MAXTEXT_TEST_PLATFORM."""
  return os.environ.get("HF2MAXTEXT_TEST_PLATFORM", "cpu")


def start_jax() -> None:
  """JAX's default backend is the suite's platform: the validator's sharded restores go onto its devices and, on
  an accelerator, its forward pass runs there too; the reference forward pass runs on the host's CPU beside it
  (tools/forward.py and tools/validate_lib.py say why)."""
  import jax  # pylint: disable=g-import-not-at-top

  platform = test_platform()
  jax_platform = {"gpu": "cuda"}.get(platform, platform)
  jax.config.update("jax_platforms", jax_platform if platform == "cpu" else f"{jax_platform},cpu")
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


def run_converter(*flags: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
  """`bazel run //converter -- FLAGS` as a user runs it, in a fresh process (JAX's device count is per process),
  with `env` added to its environment."""
  result = subprocess.run(converter_command(*flags), env=converter_env(**(env or {})), capture_output=True,
                          text=True, timeout=900)
  if check and result.returncode != 0:
    raise AssertionError(f"converter {' '.join(flags)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
  return result


class _Worker:
  """A converter_worker.py child: conversions with one simulated device count, one after another."""

  def __init__(self):
    worker = os.path.join(os.path.dirname(__file__), "converter_worker.py")
    self.child = ReusedProcess(lambda fd: [sys.executable, worker, str(fd)], converter_env())

  def run(self, flags: tuple[str, ...], timeout: float) -> subprocess.CompletedProcess | None:
    """The conversion's result, or None when the worker is gone or too slow (it is then stopped)."""
    out = scratch_dir("worker-")
    stdout, stderr = os.path.join(out, "stdout"), os.path.join(out, "stderr")
    answer = self.child.request({"argv": list(flags), "stdout": stdout, "stderr": stderr}, timeout)
    if answer is None:
      return None
    with open(stdout) as f_out, open(stderr) as f_err:
      return subprocess.CompletedProcess(converter_command(*flags), answer["returncode"], f_out.read(), f_err.read())


_workers: dict[str, _Worker] = {}


@atexit.register
def _close_workers() -> None:
  for worker in _workers.values():
    worker.child.close()
  _workers.clear()


def run_conversion(*flags: str) -> subprocess.CompletedProcess:
  """A forward conversion that must succeed, as `run_converter(*flags)` but in a converter process reused for every
  conversion with the same --simulated_cpu_devices_count (converter_worker.py: the binary's entry point, without a
  process start-up per conversion). A conversion that fails there runs again as a fresh process, so a failure, its
  exit status and its messages are always the binary's own. For tests of conversions, not of the command line."""
  if any(f.startswith(("--direction", "--dry_run", "--num_processes")) for f in flags):
    return run_converter(*flags)  # Not a plain forward conversion: as a process of its own.
  devices = next((f.split("=", 1)[1] for f in reversed(flags) if f.startswith("--simulated_cpu_devices_count=")),
                 "default")
  worker = _workers.get(devices)
  if worker is None or not worker.child.alive:
    worker = _workers[devices] = _Worker()
  result = worker.run(flags, timeout=900)
  if result is not None and result.returncode == 0:
    return result
  return run_converter(*flags)


# What the binary assumes for a flag left out (converter/main.py), so that equal settings share a conversion.
_FLAG_DEFAULTS = {"--scan_layers": "true", "--lazy_load_tensors": "true", "--simulated_cpu_devices_count": "16"}
_conversions: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}


def _setting(flags: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
  """`flags` as (name, value) pairs, defaults filled in, booleans in one spelling, order ignored."""
  setting = dict(_FLAG_DEFAULTS)
  for flag in flags:
    name, _, value = flag.partition("=")
    setting[name] = value.lower() if value.lower() in ("true", "false") else value
  return tuple(sorted(setting.items()))


def converted(model_dir: str, *flags: str) -> str:
  """The items path (OUT/0/items) of `model_dir` converted with `flags` (run_conversion), converted once per
  process for each distinct setting: every test that reads the same conversion shares it, so none may change it
  (copy it first, as the tests that damage a checkpoint do)."""
  key = (model_dir, _setting(flags))
  if key not in _conversions:
    out = scratch_dir("mt-")
    run_conversion(f"--hf_model_path={model_dir}", f"--output_dir={out}", *flags)
    _conversions[key] = os.path.join(out, "0", "items")
  return _conversions[key]


def assert_refused(test: Any, model_dir: str, *expected: str, flags: tuple[str, ...] = (),
                   out: str | None = None) -> str:
  """Converting `model_dir` exits 1 with exactly one `error:` line holding every `expected` text, no traceback and
  nothing that looks committed; returns that line."""
  out = out or scratch_dir("out-")
  return assert_run_refused(test, out, f"--hf_model_path={model_dir}", "--simulated_cpu_devices_count=1", *flags,
                            expected=expected)


def assert_run_refused(test: Any, out: str, *args: str, expected: tuple[str, ...] = ()) -> str:
  """The converter run with `args` into `out` exits 1 with exactly one `error:` line holding every `expected` text,
  no traceback and nothing under `out` that looks committed (an Orbax step or a published HF model); returns that
  line."""
  result = run_converter(*args, f"--output_dir={out}", check=False)
  test.assertEqual(result.returncode, 1, result.stderr[-2000:])
  error_lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  test.assertLen(error_lines, 1, result.stderr[-2000:])
  for text in expected:
    test.assertIn(text, error_lines[0])
  test.assertNotIn("Traceback", result.stderr)
  test.assertEqual(committed_files(out), [])
  test.assertFalse(os.path.exists(os.path.join(out, "config.json")))
  return error_lines[0]


def committed_files(output_dir: str) -> list[str]:
  """What would make a reader take `output_dir` for a finished checkpoint: a step directory or a commit file."""
  found = [os.path.join(d, f) for d, _, fs in os.walk(output_dir) for f in fs if f == "commit_success.txt"]
  if os.path.exists(os.path.join(output_dir, "0")):
    found.append(os.path.join(output_dir, "0"))
  return found


class GroupShardingLoader(absltest.TestLoader):
  """Bazel's shards, split by groups of cases instead of round-robin by case.

  absltest deals a class's cases to the shards one by one, so every shard of a per-model matrix ends up building
  (and running transformers on) nearly every tiny model. Here all cases of one group (one model, see `model_group`)
  go to the same shard, whatever their class, and the groups are spread over the shards by their number of cases:
  each model is built once in one process, and every case still runs exactly once.
  """

  def __init__(self, group_of: Callable[[str], str]):
    super().__init__()
    self._group_of = group_of
    self._owners: dict[str, int] | None = None

  def _plan(self, total: int) -> dict[str, int]:
    """Each group's shard, from every test class of the test's main module (the same in every shard)."""
    module = sys.modules["__main__"]
    names = [name for cls in vars(module).values()
             if isinstance(cls, type) and issubclass(cls, absltest.TestCase)
             for name in absltest.TestLoader().getTestCaseNames(cls)]
    groups: dict[str, int] = {}
    for name in names:
      group = self._group_of(name)
      groups[group] = groups.get(group, 0) + 1
    loads = [0] * total
    owners: dict[str, int] = {}
    for group in sorted(groups, key=lambda g: (-groups[g], g)):
      owners[group] = min(range(total), key=lambda i: (loads[i], i))
      loads[owners[group]] += groups[group]
    return owners

  def shardTestCaseNames(self, iterator: Any, ordered_names: Sequence[str], shard_index: int) -> list[str]:  # pylint: disable=invalid-name
    del iterator  # Every shard computes the same assignment from the names alone.
    if self._owners is None:
      self._owners = self._plan(int(os.environ.get("TEST_TOTAL_SHARDS", "1")))
    return [name for name in ordered_names if self._owners.get(self._group_of(name), 0) == shard_index]


def model_group(pattern: str, others: dict[str, str] | None = None) -> Callable[[str], str]:
  """A `GroupShardingLoader` key: the model a case's name holds (the first group of `pattern` that matched, e.g.
  r"test_float32_round_trip_(.+)_devices"), else the model `others` maps the name to, else the case itself."""
  compiled = re.compile(pattern)

  def group_of(name: str) -> str:
    match = compiled.match(name)
    if match:
      return next(group for group in match.groups() if group)
    return (others or {}).get(name, name)

  return group_of
