"""The save path streams: no whole stacked leaf, let alone the whole tree, is ever alive at once.

Every array a loader hands to the writer, and every array read from the safetensors files (packed MXFP4 bytes
included), is tracked until it is freed; the peak of bytes alive must stay within the byte budget plus one block,
far below the largest scanned leaf, at 1 and at 16 devices, for per-expert tensors (Qwen3-MoE) and for fused
expert tensors read through the MXFP4 dequantizer (GPT-OSS). The result must still be the same checkpoint as the
eager arm, value for value.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from unittest import mock
import weakref

import jax

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 16)

import numpy as np  # pylint: disable=g-import-not-at-top,g-bad-import-order
from absl.testing import absltest, parameterized

from converter import families  # pylint: disable=g-import-not-at-top
from converter.options import PlanOptions, SaveOptions  # pylint: disable=g-import-not-at-top
from converter.output import orbax_writer  # pylint: disable=g-import-not-at-top
from converter.output.destinations import destination_for  # pylint: disable=g-import-not-at-top
from converter.model_config import load_model_config
from converter.planning.plan import build_plan
from converter.sources import open_source
from converter.sources.safetensors import TensorInfo
from integration_tests import harness
from tools import checkpoint_io, quantize
from tools.testing import tiny_models


class LiveBytes:
  """Bytes of loader output alive right now, and the most ever alive at once."""

  def __init__(self):
    self._lock = threading.Lock()
    self.alive = 0
    self.peak = 0
    self.largest = 0

  def track(self, array: np.ndarray) -> np.ndarray:
    with self._lock:
      self.alive += array.nbytes
      self.peak = max(self.peak, self.alive)
      self.largest = max(self.largest, array.nbytes)
    weakref.finalize(array, self._free, array.nbytes)
    return array

  def _free(self, nbytes: int) -> None:
    with self._lock:
      self.alive -= nbytes


@dataclasses.dataclass(frozen=True)
class TrackedLoader:
  """Wraps a plan loader; every array it returns is counted while it lives."""

  inner: object
  live: LiveBytes

  @property
  def block_shape(self):
    return self.inner.block_shape

  def __call__(self):
    return self.live.track(self.inner())

  def region(self, index):
    return self.live.track(self.inner.region(index))


class StreamingMemoryTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Bigger than the default tiny models so a stacked leaf dwarfs the budget: 8 layers x 8 experts.
    cls.model_dirs = {
        "qwen3_moe": tiny_models.build_tiny_model("qwen3_moe", harness.scratch_dir("moe-hf-"), num_hidden_layers=8,
                                                  num_experts=8),
        "gpt_oss_mxfp4": quantize.quantize_mxfp4(
            tiny_models.build_tiny_model("gpt_oss", harness.scratch_dir("gpt-oss-hf-"), num_hidden_layers=8,
                                         num_local_experts=8),
            harness.scratch_dir("gpt-oss-mxfp4-")),
    }

  def _plan(self, model: str):
    config = load_model_config(self.model_dirs[model])
    return build_plan(open_source(self.model_dirs[model], config.raw, config.path), families.resolve(config),
                      PlanOptions(scan_layers=True, save_dtype="float32"))

  @parameterized.named_parameters(("qwen3_moe_devices1", "qwen3_moe", 1), ("qwen3_moe_devices16", "qwen3_moe", 16),
                                  ("gpt_oss_mxfp4_devices1", "gpt_oss_mxfp4", 1))
  def test_peak_live_bytes_stays_within_budget(self, model, devices):
    budget = 256 << 10
    live = LiveBytes()
    plan = self._plan(model)
    tracked = dataclasses.replace(
        plan, leaves=tuple(dataclasses.replace(leaf, loader=TrackedLoader(leaf.loader, live)) for leaf in plan.leaves)
    )
    out = harness.scratch_dir("stream-")
    stored_read = TensorInfo.read
    tracked_read = lambda info, *args, **kwargs: live.track(stored_read(info, *args, **kwargs))
    with mock.patch.object(TensorInfo, "read", tracked_read):
      items = orbax_writer.save(tracked, destination_for(out),
                                SaveOptions(lazy=True, devices=devices, max_inflight_bytes=budget),
                                custom_metadata={"scan_layers": True})
    largest_leaf = max(leaf.nbytes for leaf in plan.leaves)
    self.assertGreater(largest_leaf, 4 * budget)  # Otherwise this test would prove nothing.
    # A block is alive twice while it is transformed (as read from the file, and as transformed).
    self.assertLessEqual(live.peak, budget + 2 * live.largest)
    self.assertLess(live.peak, largest_leaf)
    self.assertLess(live.largest, largest_leaf)
    # Same values as the eager reference arm.
    eager_out = harness.scratch_dir("eager-")
    eager = orbax_writer.save(self._plan(model), destination_for(eager_out),
                              SaveOptions(lazy=False, devices=1, max_inflight_bytes=budget),
                              custom_metadata={"scan_layers": True})
    diffs = checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(items), checkpoint_io.restore_v0(eager))
    self.assertEqual(diffs, [])
    types = set(checkpoint_io.leaf_value_types(items).values()) - {"scalar", "Dict"}
    self.assertEqual(types, {"jax.Array" if devices > 1 else "np.ndarray"})
    self.assertTrue(os.path.exists(os.path.join(out, "0", "commit_success.txt")))


if __name__ == "__main__":
  absltest.main()
