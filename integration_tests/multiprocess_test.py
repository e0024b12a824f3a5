"""One conversion across several processes (JAX's distributed runtime on 127.0.0.1, started by the test): the
checkpoint equals the single-process one bit for bit, every process wrote about 1/N of it, and a process killed
mid-save ends the others non-zero with nothing committed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

from absl.testing import absltest, parameterized

from integration_tests import fixtures, harness

harness.start_jax()

from handlers import shares  # pylint: disable=g-import-not-at-top
from tools import checkpoint_io, gcs_emulator, synthetic_checkpoint  # pylint: disable=g-import-not-at-top
from tools.ports import free_port  # pylint: disable=g-import-not-at-top

_STARTUP_TIMEOUT_S = 300


def start_processes(count: int, *flags: str) -> list[subprocess.Popen]:
  """`count` converter processes joined through a coordinator on 127.0.0.1 (process 0 hosts it)."""
  address = f"127.0.0.1:{free_port()}"
  return [subprocess.Popen(harness.converter_command(*flags, f"--num_processes={count}", f"--process_id={i}",
                                                     f"--coordinator_address={address}", "--noprogress"),
                           env=harness.converter_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for i in range(count)]


def finish(children: list[subprocess.Popen], timeout: float = 600) -> list[subprocess.CompletedProcess]:
  results = []
  for child in children:
    try:
      stdout, stderr = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
      child.kill()
      stdout, stderr = child.communicate()
    results.append(subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr))
  return results


def _model(name: str) -> str:
  if name == "dense":
    config = synthetic_checkpoint.llama_config(hidden=256, layers=4, intermediate=512, heads=4, kv_heads=2,
                                               vocab=1000)
    shapes = synthetic_checkpoint.llama_shapes(config)
    directory = harness.scratch_dir(f"multiprocess-{name}-")
    synthetic_checkpoint.write_checkpoint(directory, config, list(shapes), max_shard_bytes=1 << 20)
    return directory
  return fixtures.write_moe(f"multiprocess-{name}-", fixtures.SMALL_MOE, max_shard_bytes=1 << 20, layers=3)


class MultiProcessTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.models = {name: _model(name) for name in ("dense", "moe")}

  @parameterized.product(model=["dense", "moe"], scan=[True, False], processes=[2, 4])
  def test_shares_add_up_to_the_single_process_checkpoint(self, model, scan, processes):
    flags = [f"--hf_model_path={self.models[model]}", f"--scan_layers={scan}", "--simulated_cpu_devices_count=1",
             "--max_inflight_bytes=1048576"]
    out = os.path.join(harness.scratch_dir("multiprocess-"), "out")
    results = finish(start_processes(processes, *flags, f"--output_dir={out}", "--verify"))
    for i, result in enumerate(results):
      self.assertEqual(result.returncode, 0, f"process {i}:\n{result.stderr[-3000:]}")
    reference = os.path.join(harness.scratch_dir("multiprocess-ref-"), "out")
    harness.run_converter(*flags[:-2], f"--simulated_cpu_devices_count={processes}", f"--output_dir={reference}",
                          "--max_inflight_bytes=1048576", "--noprogress")
    restored = checkpoint_io.restore_v0(os.path.join(out, "0", "items"))
    expected = checkpoint_io.restore_v0(os.path.join(reference, "0", "items"))
    self.assertEqual(checkpoint_io.trees_bit_identical(restored, expected), [])
    self.assertEqual(checkpoint_io.trees_bit_identical(
        checkpoint_io.restore_v1(os.path.join(out, "0", "items"), expected), expected), [])
    self.assertEqual(set(checkpoint_io.leaf_value_types(os.path.join(out, "0", "items")).values()) - {"scalar", "Dict"},
                     {"jax.Array"})
    written = [int(re.search(r"wrote ([\d,]+) bytes", r.stdout).group(1).replace(",", "")) for r in results]
    total = int(re.search(r"bytes:\s+([\d,]+)", results[0].stdout).group(1).replace(",", ""))
    self.assertEqual(sum(written), total)
    verified = [re.search(r"verified:.* (\d+) blocks, ([\d,]+) bytes, (\d+) mismatches", r.stdout).groups()
                for r in results]
    self.assertEqual(sum(int(b.replace(",", "")) for _, b, _ in verified), total)  # Each its share, together all.
    self.assertEqual({m for _, _, m in verified}, {"0"})
    dry = harness.run_converter(*flags, f"--output_dir={out}-dry", f"--num_processes={processes}", "--dry_run")
    self.assertEqual([int(n.replace(",", "")) for n in re.findall(r"process \d+ writes: ([\d,]+) bytes", dry.stdout)],
                     written)
    # Blocks are at most 256 KiB here (a quarter of the budget); each of a process's stripes ends within half a
    # block of its even cut (handlers/shares.py), so a share is within that many blocks of an even split.
    stripes = shares.stripes_per_process(sum(int(n) for n, _, _ in verified), processes)
    for share in written:
      self.assertLessEqual(abs(share - total / processes), stripes * 262_144, written)
    self.assertEqual(sorted(os.listdir(os.path.join(out, "0", "items"))).count("ocdbt.process_0"), 1)
    self.assertLen([n for n in os.listdir(os.path.join(out, "0", "items")) if n.startswith("ocdbt.process_")],
                   processes)

  @parameterized.parameters(2, 4)
  def test_reverse_direction_shares_the_shards(self, processes):
    items = os.path.join(harness.scratch_dir("multiprocess-items-"), "out")
    harness.run_converter(f"--hf_model_path={self.models['moe']}", f"--output_dir={items}",
                          "--simulated_cpu_devices_count=1", "--noprogress")
    flags = ["--direction=to_huggingface", f"--checkpoint_path={items}/0/items", "--max_shard_size=1MB"]
    back = os.path.join(harness.scratch_dir("multiprocess-back-"), "hf")
    results = finish(start_processes(processes, *flags, f"--output_dir={back}"))
    for i, result in enumerate(results):
      self.assertEqual(result.returncode, 0, f"process {i}:\n{result.stderr[-3000:]}")
    wrote = [int(re.search(r"wrote (\d+) of (\d+) shards", r.stdout).group(1)) for r in results]
    shards = int(re.search(r"wrote \d+ of (\d+) shards", results[0].stdout).group(1))
    self.assertEqual(sum(wrote), shards)
    self.assertTrue(all(w > 0 for w in wrote), wrote)
    single = os.path.join(harness.scratch_dir("multiprocess-back-"), "hf")
    harness.run_converter(*flags, f"--output_dir={single}", "--noprogress")
    self.assertEqual(sorted(os.listdir(back)), sorted(os.listdir(single)))
    for name in os.listdir(single):
      with open(os.path.join(back, name), "rb") as a, open(os.path.join(single, name), "rb") as b:
        self.assertEqual(a.read(), b.read(), name)
    self.assertEqual([n for n in os.listdir(os.path.dirname(back)) if "hf2maxtext" in n], [])

  def test_a_maxtext_checkpoint_laid_out_again_by_two_processes(self):
    items = os.path.join(harness.scratch_dir("multiprocess-items-"), "out")
    harness.run_converter(f"--hf_model_path={self.models['moe']}", f"--output_dir={items}",
                          "--simulated_cpu_devices_count=1", "--noprogress")
    flags = [f"--checkpoint_path={items}/0/items", "--scan_layers=false", "--simulated_cpu_devices_count=1",
             "--max_inflight_bytes=1048576"]
    out = os.path.join(harness.scratch_dir("multiprocess-relaid-"), "out")
    results = finish(start_processes(2, *flags, f"--output_dir={out}", "--verify"))
    for i, result in enumerate(results):
      self.assertEqual(result.returncode, 0, f"process {i}:\n{result.stderr[-3000:]}")
      self.assertIn(", 0 mismatches", result.stdout)
    reference = os.path.join(harness.scratch_dir("multiprocess-ref-"), "out")
    harness.run_converter(f"--hf_model_path={self.models['moe']}", "--scan_layers=false",
                          "--simulated_cpu_devices_count=2", f"--output_dir={reference}", "--noprogress")
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(os.path.join(out, "0", "items")),
                                                       checkpoint_io.restore_v0(os.path.join(reference, "0", "items"))),
                     [])

  def test_two_processes_into_a_bucket(self):
    flags = [f"--hf_model_path={self.models['moe']}", "--simulated_cpu_devices_count=1", "--max_inflight_bytes=1048576"]
    with gcs_emulator.GcsEmulator() as gcs:
      gcs.create_bucket("ckpts")
      previous = os.environ.get("STORAGE_EMULATOR_HOST")
      os.environ.update(gcs.env)
      try:
        results = finish(start_processes(2, *flags, "--output_dir=gs://ckpts/mp", "--verify"))
      finally:
        os.environ.pop("STORAGE_EMULATOR_HOST")
        if previous is not None:
          os.environ["STORAGE_EMULATOR_HOST"] = previous
      for i, result in enumerate(results):
        self.assertEqual(result.returncode, 0, f"process {i}:\n{result.stderr[-3000:]}")
        self.assertIn(", 0 mismatches", result.stdout)
      self.assertIn("mp/0/commit_success.txt", gcs.object_names("ckpts", "mp/"))
      copy = os.path.join(harness.scratch_dir("multiprocess-copy-"), "out")
      gcs.download_dir("ckpts", "mp", copy)
    reference = os.path.join(harness.scratch_dir("multiprocess-ref-"), "out")
    harness.run_converter(*flags[:-2], "--simulated_cpu_devices_count=2", "--max_inflight_bytes=1048576",
                          f"--output_dir={reference}", "--noprogress")
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(os.path.join(copy, "0", "items")),
                                                       checkpoint_io.restore_v0(os.path.join(reference, "0", "items"))),
                     [])

  def test_distributed_auto_finds_a_slurm_job(self):
    # What srun sets for each task; JAX derives the coordinator's port from the job id (61440 + id % 4096).
    port = free_port(61440, 65535)
    out = os.path.join(harness.scratch_dir("multiprocess-slurm-"), "out")
    flags = [f"--hf_model_path={self.models['dense']}", "--simulated_cpu_devices_count=1",
             "--max_inflight_bytes=1048576"]
    children = []
    for task in range(2):
      env = harness.converter_env()
      env.update(SLURM_JOB_ID=str(port - 61440), SLURM_STEP_NODELIST="127.0.0.1", SLURM_NTASKS="2",
                 SLURM_PROCID=str(task), SLURM_LOCALID=str(task), SLURM_STEP_NUM_NODES="1",
                 JAX_COORDINATOR_BIND_ADDRESS=f"127.0.0.1:{port}")
      children.append(subprocess.Popen(harness.converter_command(*flags, f"--output_dir={out}", "--distributed=auto",
                                                                 "--noprogress"),
                                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = finish(children)
    for i, result in enumerate(results):
      self.assertEqual(result.returncode, 0, f"task {i}:\n{result.stderr[-3000:]}")
    written = [int(re.search(r"wrote ([\d,]+) bytes", r.stdout).group(1).replace(",", "")) for r in results]
    self.assertTrue(all(share > 0 for share in written), written)
    self.assertEqual(sum(written), int(re.search(r"bytes:\s+([\d,]+)", results[0].stdout).group(1).replace(",", "")))
    reference = os.path.join(harness.scratch_dir("multiprocess-ref-"), "out")
    harness.run_converter(*flags[:1], "--simulated_cpu_devices_count=2", "--max_inflight_bytes=1048576",
                          f"--output_dir={reference}", "--noprogress")
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(os.path.join(out, "0", "items")),
                                                       checkpoint_io.restore_v0(os.path.join(reference, "0", "items"))),
                     [])

  def test_several_processes_need_a_coordinator(self):
    out = os.path.join(harness.scratch_dir("multiprocess-"), "out")
    flags = [f"--hf_model_path={self.models['dense']}", f"--output_dir={out}", "--simulated_cpu_devices_count=1"]
    alone = harness.run_converter(*flags, "--num_processes=2", check=False)
    self.assertEqual(alone.returncode, 1)
    self.assertIn("error: --num_processes > 1 needs --coordinator_address", alone.stderr)
    self.assertEqual(harness.committed_files(out), [])

  def test_a_killed_process_ends_the_others_and_resume_finishes_identically(self):
    # About 0.8 GB in small blocks (a 256 KiB budget): several seconds of writing to interrupt.
    model = fixtures.write_moe("multiprocess-kill-", fixtures.STREAMED_MOE, hidden=1024, moe_dim=512)
    out = os.path.join(harness.scratch_dir("multiprocess-"), "out")
    flags = [f"--hf_model_path={model}", f"--output_dir={out}", "--simulated_cpu_devices_count=1",
             "--max_inflight_bytes=262144"]
    children = start_processes(2, *flags)
    deadline = time.monotonic() + _STARTUP_TIMEOUT_S
    second_wrote = lambda: any(d.endswith(os.path.join("ocdbt.process_1", "d")) for d, _, _ in os.walk(out))
    while time.monotonic() < deadline and all(c.poll() is None for c in children) and not second_wrote():
      time.sleep(0.01)
    self.assertTrue(all(c.poll() is None for c in children), "a process finished before the kill")
    children[1].send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    survivor = finish(children[:1], timeout=300)[0]
    ended_after = time.monotonic() - killed_at
    finish(children[1:])
    self.assertNotEqual(survivor.returncode, 0)
    self.assertEqual(harness.committed_files(out), [])
    print(f"the surviving process exited {ended_after:.1f} s after the other was killed")
    self.assertLess(ended_after, 120)
    # JAX's distributed client ends the process itself (SIGABRT) once the coordinator reports the dead peer.
    self.assertIn("another task died", survivor.stderr)

    resumed = finish(start_processes(2, *flags, "--resume", "--verify"))
    for i, result in enumerate(resumed):
      self.assertEqual(result.returncode, 0, f"process {i}:\n{result.stderr[-3000:]}")
      self.assertIn(", 0 mismatches", result.stdout)
    reused = [int(re.search(r"resumed:\s+(\d+) blocks", r.stdout).group(1)) for r in resumed]
    self.assertGreater(sum(reused), 0)
    self.assertFalse(os.path.exists(os.path.join(out, "0.hf2maxtext-resume")))
    reference = os.path.join(harness.scratch_dir("multiprocess-ref-"), "out")
    harness.run_converter(f"--hf_model_path={model}", f"--output_dir={reference}", "--simulated_cpu_devices_count=2",
                          "--max_inflight_bytes=262144", "--noprogress")
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(os.path.join(out, "0", "items")),
                                                       checkpoint_io.restore_v0(os.path.join(reference, "0", "items"))),
                     [])


if __name__ == "__main__":
  absltest.main()
