"""Checkpoints in buckets, against a real GCS endpoint (fake-gcs-server on 127.0.0.1, started by the test).

The converter only ever sees STORAGE_EMULATOR_HOST; the test moves bytes in and out of the emulator with its plain
JSON API, so a bug in the converter's own bucket code cannot hide in the checks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import threading
import time
from unittest import mock

from absl.testing import absltest, parameterized
import numpy as np

from tools import gcs_emulator
from integration_tests import fixtures, harness

harness.start_jax()

from handlers import LazyTensor, WriteOptions, streaming  # pylint: disable=g-import-not-at-top
from converter.checkpoint_format.record import ConversionRecord  # pylint: disable=g-import-not-at-top
from tools import checkpoint_io  # pylint: disable=g-import-not-at-top


_BUDGET = fixtures.STREAMING_BUDGET


class GcsTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.gcs = gcs_emulator.GcsEmulator()
    cls.gcs.start()
    cls.model = fixtures.write_moe("gcs-hf-", fixtures.SMALL_MOE, max_shard_bytes=4 << 20)
    for bucket in ("models", "ckpts"):
      cls.gcs.create_bucket(bucket)
    cls.gcs.upload_dir(cls.model, "models", "tiny")
    cls.local = {}
    for devices in (1, 16):
      out = os.path.join(harness.scratch_dir("gcs-local-"), "out")
      harness.run_converter(f"--hf_model_path={cls.model}", f"--output_dir={out}",
                            f"--simulated_cpu_devices_count={devices}", _BUDGET, "--noprogress")
      cls.local[devices] = out

  @classmethod
  def tearDownClass(cls):
    cls.gcs.stop()
    super().tearDownClass()

  def convert(self, *flags: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, **self.gcs.env)
    previous = os.environ.copy()
    os.environ.update(env)
    try:
      return harness.run_converter(*flags, "--noprogress", check=check)
    finally:
      os.environ.clear()
      os.environ.update(previous)

  def download(self, bucket: str, prefix: str) -> str:
    local = os.path.join(harness.scratch_dir("gcs-download-"), "out")
    self.gcs.download_dir(bucket, prefix, local)
    return local

  def assert_committed_like(self, bucket: str, prefix: str, local_out: str) -> None:
    names = self.gcs.object_names(bucket, prefix + "/")
    self.assertIn(f"{prefix}/0/commit_success.txt", names)
    self.assertIn(f"{prefix}/0/_CHECKPOINT_METADATA", names)
    self.assertFalse([n for n in names if "hf2maxtext-resume" in n or ".lock" in n], names)
    copy = self.download(bucket, prefix)
    diffs = checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(os.path.join(copy, "0", "items")),
                                              checkpoint_io.restore_v0(os.path.join(local_out, "0", "items")))
    self.assertEqual(diffs, [])
    self.assertEqual(ConversionRecord.read(os.path.join(copy, "0", "items")).family,
                     ConversionRecord.read(os.path.join(local_out, "0", "items")).family)

  @parameterized.parameters(1, 16)
  def test_bucket_to_bucket_equals_local(self, devices):
    prefix = f"gs2gs-{devices}"
    result = self.convert("--hf_model_path=gs://models/tiny", f"--output_dir=gs://ckpts/{prefix}",
                          f"--simulated_cpu_devices_count={devices}", _BUDGET, "--verify")
    self.assertIn(", 0 mismatches", result.stdout)
    self.assertIn("gs://ckpts/" + prefix + "/0/items", result.stdout)
    self.assert_committed_like("ckpts", prefix, self.local[devices])

  def test_lora_adapter_in_a_bucket_equals_local(self):
    from tools import lora_adapters  # pylint: disable=g-import-not-at-top

    adapter = lora_adapters.write_random_adapter(self.model, harness.scratch_dir("gcs-adapter-"),
                                                 ("model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.o_proj"))
    self.gcs.upload_dir(adapter, "models", "tiny-lora")
    local = os.path.join(harness.scratch_dir("gcs-lora-"), "out")
    harness.run_converter(f"--hf_model_path={self.model}", f"--output_dir={local}", f"--lora_adapter_path={adapter}",
                          "--simulated_cpu_devices_count=1", "--noprogress")
    self.convert(f"--hf_model_path={self.model}", "--lora_adapter_path=gs://models/tiny-lora",
                 "--output_dir=gs://ckpts/lora", "--simulated_cpu_devices_count=1")
    self.assert_committed_like("ckpts", "lora", local)
    record = ConversionRecord.read(os.path.join(self.download("ckpts", "lora"), "0", "items")).lora_adapter
    self.assertEqual((record["path"], len(record["modules"])), ("gs://models/tiny-lora", 2))

  def test_dry_run_reads_the_bucket_and_writes_nothing(self):
    result = self.convert("--hf_model_path=gs://models/tiny", "--output_dir=gs://ckpts/dry",
                          "--simulated_cpu_devices_count=1", "--dry_run")
    self.assertIn("decoder/layers/moe_block/wo ", result.stdout)
    self.assertIn("model.layers.0.mlp.experts.0.down_proj.weight", result.stdout)
    self.assertEqual(self.gcs.object_names("ckpts", "dry/"), [])

  def test_reverse_direction_bucket_to_bucket(self):
    prefix = "for-reverse"
    self.convert("--hf_model_path=gs://models/tiny", f"--output_dir=gs://ckpts/{prefix}",
                 "--simulated_cpu_devices_count=1", _BUDGET)
    local_back = os.path.join(harness.scratch_dir("gcs-back-local-"), "hf")
    harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={self.local[1]}/0/items",
                          f"--output_dir={local_back}", "--noprogress")
    self.convert("--direction=to_huggingface", f"--checkpoint_path=gs://ckpts/{prefix}/0/items",
                 "--output_dir=gs://ckpts/back", "--max_shard_size=1MB")
    names = self.gcs.object_names("ckpts", "back/")
    self.assertIn("back/config.json", names)
    self.assertIn("back/model.safetensors.index.json", names)
    back = checkpoint_io.read_safetensors_dir(self.download("ckpts", "back"))
    original = checkpoint_io.read_safetensors_dir(self.model)
    self.assertEqual(sorted(back), sorted(original))
    for name, value in checkpoint_io.read_safetensors_dir(local_back).items():
      self.assertEqual(back[name].tobytes(), value.tobytes(), name)
      np.testing.assert_array_equal(back[name].astype(np.float32), original[name].astype(np.float32), name)

  def test_missing_bucket_and_object_are_named(self):
    result = self.convert("--hf_model_path=gs://models/tiny", "--output_dir=gs://no-such-bucket/x",
                          "--simulated_cpu_devices_count=1", check=False)
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertIn("gs://no-such-bucket", result.stderr)
    self.assertIn("does not exist", result.stderr)
    result = self.convert("--hf_model_path=gs://no-such-bucket/tiny", "--output_dir=gs://ckpts/x",
                          "--simulated_cpu_devices_count=1", check=False)
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertIn("bucket gs://no-such-bucket does not exist", result.stderr)
    result = self.convert("--hf_model_path=gs://models/absent", "--output_dir=gs://ckpts/x",
                          "--simulated_cpu_devices_count=1", check=False)
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertIn("gs://models/absent", result.stderr)
    self.assertIn("not found", result.stderr)
    self.assertNotIn("Traceback", result.stderr)
    self.assertEqual(self.gcs.object_names("ckpts", "x/"), [])


class GcsOutageTest(absltest.TestCase):
  """The server stops mid-save: the conversion fails and commits nothing; after a restart `--resume` finishes it."""

  def test_server_stopped_mid_save_then_resume(self):
    model = fixtures.write_moe("outage-hf-", fixtures.STREAMED_MOE)  # Still writing when the server stops.
    reference = os.path.join(harness.scratch_dir("outage-local-"), "out")
    flags = [f"--hf_model_path={model}", "--simulated_cpu_devices_count=1", _BUDGET, "--noprogress",
             "--storage_retries=3"]
    harness.run_converter(*flags, f"--output_dir={reference}")

    with gcs_emulator.GcsEmulator() as gcs:
      gcs.create_bucket("ckpts")
      # A short lease: the failed run cannot delete its lock object while the server is down, and the resumed
      # run must see it as stale rather than wait out the default 60 s.
      env = harness.converter_env(HF2MAXTEXT_LOCK_LEASE_S="5", **gcs.env)
      command = harness.converter_command(*flags, "--output_dir=gs://ckpts/out")
      child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      deadline = time.monotonic() + 300
      while (not [n for n in gcs.object_names("ckpts", "out/") if ".journal." in n] and child.poll() is None
             and time.monotonic() < deadline):
        time.sleep(0.05)
      self.assertIsNone(child.poll(), "the conversion finished before the server could be stopped")
      gcs.stop()
      stopped_at = time.monotonic()
      _, stderr = child.communicate(timeout=600)
      failed_after = time.monotonic() - stopped_at
      self.assertNotEqual(child.returncode, 0)
      error_lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
      self.assertLen(error_lines, 1, stderr[-3000:])
      self.assertIn("gs://ckpts/out", error_lines[0])
      self.assertNotIn("Traceback", stderr)
      self.assertLess(failed_after, 300)
      print(f"conversion failed {failed_after:.1f} s after the server stopped (--storage_retries=3)")

      gcs.start()  # The same buckets, on a new port.
      env.update(gcs.env)
      names = gcs.object_names("ckpts", "out/")
      self.assertNotIn("out/0/commit_success.txt", names)
      self.assertTrue([n for n in names if ".journal." in n], names)
      resumed = subprocess.run([*command, "--resume", "--verify"], env=env, capture_output=True, text=True,
                               timeout=600)
      self.assertEqual(resumed.returncode, 0, resumed.stderr[-3000:])
      self.assertGreater(int(resumed.stdout.split("resumed:")[1].split()[0]), 0)
      self.assertIn(", 0 mismatches", resumed.stdout)
      names = gcs.object_names("ckpts", "out/")
      self.assertIn("out/0/commit_success.txt", names)
      self.assertFalse([n for n in names if "hf2maxtext-resume" in n], names)
      copy = os.path.join(harness.scratch_dir("outage-copy-"), "out")
      gcs.download_dir("ckpts", "out", copy)
      diffs = checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(os.path.join(copy, "0", "items")),
                                                checkpoint_io.restore_v0(os.path.join(reference, "0", "items")))
      self.assertEqual(diffs, [])


@dataclasses.dataclass(frozen=True)
class _Rows:
  """A loader of an (8, 4) float32 leaf, one row per block."""

  shape: tuple[int, ...] = (8, 4)

  @property
  def block_shape(self) -> tuple[int, ...]:
    return (1, 4)

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    return np.zeros((1, 4), np.float32)


class _LateWrite:
  """A write that completes as tensorstore's do once a bucket is down: later, from another thread, through
  `loop.call_soon_threadsafe`, whether or not the awaiting task was cancelled meanwhile (in the outage the
  binding delivered `(tensorstore.Future, <Future cancelled>)` to a loop Orbax had closed)."""

  def __init__(self, delay_s: float, error: BaseException, delivery_errors: list[BaseException]):
    self._delay_s, self._error, self._delivery_errors = delay_s, error, delivery_errors

  def __await__(self):
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def fail(done: asyncio.Future) -> None:
      if not done.done():
        done.set_exception(self._error)

    def complete() -> None:
      time.sleep(self._delay_s)
      try:
        loop.call_soon_threadsafe(fail, future)
      except RuntimeError as e:  # What tensorstore's binding printed as a bare traceback.
        self._delivery_errors.append(e)

    threading.Thread(target=complete, daemon=True).start()
    return future.__await__()


class InFlightWritesAfterAFailureTest(absltest.TestCase):
  """The outage's failure path without a server: one block's write fails while another's is still in flight."""

  def test_a_failed_save_returns_only_after_every_write_in_flight_has_completed(self):
    delivery_errors: list[BaseException] = []
    # Row 0 fails at once and row 1 soon after; the later rows' writes fail a second after they start: the save
    # gives up (at its next block) while row 2's write is still in flight.
    delays = {row: {0: 0.0, 1: 0.3}.get(row, 1.0) for row in range(8)}

    class Store:

      def __getitem__(self, index):
        row = index[0].start
        return mock.Mock(write=lambda block, **kwargs: _LateWrite(delays[row], ValueError("ABORTED: server down"),
                                                                  delivery_errors))

    async def fake_open(lazy, block, info, arg, metadata_key, create):
      del lazy, block, info, arg, metadata_key, create
      return Store(), None

    lazy = LazyTensor("t", (8, 4), np.float32, _Rows())
    # Two 16-byte blocks in flight at a time; the save runs as Orbax runs it: run_until_complete, then close.
    loop = asyncio.new_event_loop()
    with mock.patch.object(streaming, "_open", fake_open):
      try:
        with self.assertRaisesRegex(Exception, "server down"):
          loop.run_until_complete(streaming.write_lazy_tensors(
              [lazy], [mock.Mock(name="info")], [None], options=WriteOptions(max_inflight_bytes=32)))
      finally:
        loop.close()
    time.sleep(2.0)  # Every late write has completed by now.
    self.assertEqual(delivery_errors, [])  # None arrived at a closed event loop.


if __name__ == "__main__":
  absltest.main()
