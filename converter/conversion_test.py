"""plan_conversion with a LoRA adapter (headers only, a sparse synthetic DeepSeek V3 FP8 checkpoint): an adapted
FP8 weight is planned as merged, and an adapter whose target the family skips (the multi-token-prediction layer)
or that asks for --keep_fp8 is refused before anything is written. Planning imports neither JAX nor Orbax, and
`read_ahead` asks for the bytes of the leaves written first."""

import os
import subprocess
import sys
import tempfile
from unittest import mock

from absl.testing import absltest

from converter import conversion, storage
from converter.errors import ConversionError
from converter.options import PlanOptions, RunContext, SaveOptions
from converter.planning import lazy_leaves
from converter.sources.lora import LoraMergedSource
from tools import lora_adapters, synthetic_checkpoint


def _scratch() -> str:
  return tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))


class LoraPlanTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    config = {**synthetic_checkpoint.deepseek3_fp8_config(moe_layers=1, experts=8, vocab=256),
              "num_nextn_predict_layers": 1}
    cls.model = _scratch()
    synthetic_checkpoint.write_checkpoint(cls.model, config, list(synthetic_checkpoint.deepseek3_fp8_shapes(config)),
                                          sparse=True)

  def _adapter(self, *modules: str) -> str:
    return lora_adapters.write_random_adapter(self.model, _scratch(), modules)

  def test_fp8_weight_is_merged(self):
    adapter = self._adapter("model.layers.1.self_attn.o_proj")
    plan = conversion.plan_conversion(self.model, PlanOptions(scan_layers=False, lora_adapter_path=adapter))
    self.assertIsInstance(plan.source, LoraMergedSource)
    (leaf,) = [leaf for leaf in plan.leaves if "model.layers.1.self_attn.o_proj.weight" in leaf.sources]
    self.assertEqual(leaf.formats, ("F8_E4M3 x F32 scales, 128x128 blocks + LoRA r2",))

  def test_skipped_target_is_refused(self):
    adapter = self._adapter("model.layers.2.self_attn.o_proj")  # Layer 2 of 2: the MTP layer.
    with self.assertRaises(ConversionError) as raised:
      conversion.plan_conversion(self.model, PlanOptions(lora_adapter_path=adapter))
    for text in (os.path.join(adapter, "adapter_model.safetensors"), "'model.layers.2.self_attn.o_proj'",
                 "does not convert (skipped: the multi-token-prediction", "would be lost"):
      self.assertIn(text, str(raised.exception))

  def test_keep_fp8_is_refused(self):
    adapter = self._adapter("model.layers.1.self_attn.o_proj")
    with self.assertRaisesRegex(ConversionError, "--keep_fp8 keeps the FP8 kernels as stored"):
      conversion.plan_conversion(self.model, PlanOptions(keep_fp8=True, lora_adapter_path=adapter))


class StartUpTest(absltest.TestCase):

  def test_planning_imports_neither_jax_nor_orbax(self):
    # main.py plans (and starts reading ahead) before JAX and Orbax load: importing them here would move every
    # conversion's first read back behind them.
    code = ("import sys; from converter import conversion; from converter.options import PlanOptions, SaveOptions;"
            " plan = conversion.plan_conversion('testdata/tiny-qwen3', PlanOptions());"
            " conversion.read_ahead(plan, 1 << 20);"
            " early = conversion.read_early(plan, SaveOptions(devices=16)); assert early.join(60);"
            " assert early.read_bytes > 0, early.read_bytes;"
            " print(sorted(m for m in ('jax', 'orbax.checkpoint', 'tensorstore') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    self.assertEqual(result.stdout.strip().splitlines()[-1], "[]")

  def test_a_save_takes_the_blocks_read_early_and_writes_the_same_checkpoint(self):
    plan = conversion.plan_conversion("testdata/tiny-qwen3", PlanOptions())
    options = SaveOptions(devices=1, max_inflight_bytes=1 << 18)  # Less than the model: some blocks read early.
    early = conversion.read_early(plan, options)
    self.assertTrue(early.join(60))
    with_early = conversion.save_plan(plan, os.path.join(_scratch(), "out"), options, RunContext(early_reads=early))
    self.assertEqual(early.taken_bytes, early.read_bytes)  # Every block read early was written, none re-read.
    self.assertBetween(early.read_bytes, 1, plan.total_bytes - 1)
    without = conversion.save_plan(plan, os.path.join(_scratch(), "out"), options)
    from tools import checkpoint_io  # pylint: disable=g-import-not-at-top  (Orbax)

    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(with_early.items_path),
                                                       checkpoint_io.restore_v0(without.items_path)), [])

  def test_the_binary_loads_numpy_without_openblas_worker_threads(self):
    # OpenBLAS starts a thread per core that spins before it sleeps; main.py turns it down before numpy loads.
    def threads(code: str, **env: str) -> int:
      environment = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
      result = subprocess.run([sys.executable, "-c", f"{code}; import os; print(len(os.listdir('/proc/self/task')))"],
                              capture_output=True, text=True, check=True,
                              env={**environment, "PYTHONPATH": os.getcwd(), **env})
      return int(result.stdout.split()[-1])

    self.assertEqual(threads("import converter.main"), threads("import converter.main", OPENBLAS_NUM_THREADS="1"))
    if (os.cpu_count() or 1) > 1:  # Where OpenBLAS would start workers at all, this counts them.
      self.assertGreater(threads("import numpy"), threads("import numpy", OPENBLAS_NUM_THREADS="1"))

  def test_read_ahead_asks_for_the_first_written_leaves_bytes_up_to_the_budget(self):
    plan = conversion.plan_conversion("testdata/tiny-qwen3", PlanOptions())
    first = lazy_leaves.in_writing_order(plan)  # Smallest leaves first, as the writer takes them.
    ranges = [r for leaf in first for t in leaf.loader.source_tensors() for r in t.byte_ranges]
    with mock.patch.object(storage, "read_ahead") as read_ahead:
      budget = ranges[0][2] - ranges[0][1] + 10  # The first tensor and 10 bytes of the next.
      self.assertEqual(conversion.read_ahead(plan, budget), budget)
    (path, begin, end), (next_path, next_begin, _) = ranges[:2]
    self.assertEqual([c.args for c in read_ahead.call_args_list],
                     [(path, begin, end), (next_path, next_begin, next_begin + 10)])

  def test_storage_read_ahead_is_the_kernels_readahead_of_a_local_file(self):
    with mock.patch.object(os, "posix_fadvise") as fadvise:
      storage.read_ahead("testdata/tiny-qwen3/model.safetensors", 8, 4096)
      storage.read_ahead("gs://bucket/model.safetensors", 8, 4096)  # Buckets: read when read.
    ((_, offset, length, advice),) = [c.args for c in fadvise.call_args_list]
    self.assertEqual((offset, length, advice), (8, 4088, os.POSIX_FADV_WILLNEED))


if __name__ == "__main__":
  absltest.main()
