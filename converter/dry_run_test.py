"""`--dry_run`'s text and memory prediction on a tiny Qwen3 whose checkpoint also holds tensors the plan does not
read (a rotary cache the family skips, a stray tensor allowed as unused): the per-format counts must count only
the tensors the leaves read, so that they add up to the total printed beside them."""

import dataclasses
import json
import math
import os
import re
import tempfile

import numpy as np
from absl.testing import absltest, parameterized

from converter import dry_run, families
from converter.planning import lazy_leaves, plan
from converter.model_config import load_model_config
from converter.options import PlanOptions
from converter.sources import open_source
from converter.storage import hub
from tools import quantize
from tools.make_tiny_checkpoint import TINY_QWEN3_CONFIG, tiny_qwen3_tensors
from tools.safetensors_writer import write_safetensors

# Tensors of the tiny checkpoint that no leaf reads, each in a format no leaf reads either.
_SKIPPED = "model.layers.0.self_attn.rotary_emb.inv_freq"  # Matched by every family's ignored_tensors.
_UNUSED = "model.layers.0.mlp.stray_scale"  # Kept out of the plan by allow_unused_tensors.
_TENSORS_READ = 4 * 11 + 3  # Per layer: 2 norms, q/k/v/o, q/k norms, gate/up/down; embedding, final norm, lm_head.
_SOURCE_TENSORS = re.compile(r"^source tensors: +(\d+) \((.*)\)$", re.MULTILINE)


def _tmpdir() -> str:
  return tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))


def _write_model(model_dir: str) -> str:
  tensors = tiny_qwen3_tensors(TINY_QWEN3_CONFIG)
  tensors[_SKIPPED] = np.arange(12, dtype=np.float32)
  tensors[_UNUSED] = np.ones(4, np.float16)
  write_safetensors(os.path.join(model_dir, "model.safetensors"), tensors)
  with open(os.path.join(model_dir, "config.json"), "w") as f:
    json.dump(TINY_QWEN3_CONFIG, f)
  return model_dir


def _plan(model_dir: str, **options) -> plan.Plan:
  config = load_model_config(model_dir)
  return plan.build_plan(open_source(model_dir, config.raw, config.path), families.resolve(config),
                         PlanOptions(**{"save_dtype": "float32", "allow_unused_tensors": True, **options}))


def _source_tensor_counts(text: str) -> tuple[int, dict[str, int]]:
  """The total and the per-format counts of the "source tensors:" line."""
  match = _SOURCE_TENSORS.search(text)
  assert match, text
  parts = {}
  for part in re.split(r", (?=\d+ )", match.group(2)):
    count, fmt = part.split(" ", 1)
    parts[fmt] = int(count)
  return int(match.group(1)), parts


class DryRunTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model_dir = _write_model(_tmpdir())
    cls.plan = _plan(cls.model_dir)
    # The same checkpoint shipped in FP8 (DeepSeek's format, 32x32 blocks): its projections become F8 + scales.
    cls.fp8_dir = quantize.quantize_fp8(cls.model_dir, _tmpdir(), (32, 32))
    cls.fp8_plan = _plan(cls.fp8_dir)

  def describe(self, the_plan=None, **kwargs) -> str:
    return dry_run.describe(the_plan or self.plan, baseline_bytes=kwargs.pop("baseline_bytes", 100 << 20),
                            max_inflight_bytes=kwargs.pop("max_inflight_bytes", 1 << 30), **kwargs)

  def test_format_counts_are_of_the_tensors_read_and_add_up_to_the_total(self):
    self.assertLen(self.plan.source.tensors, _TENSORS_READ + 2)  # The skipped and the unused one are there.
    total, parts = _source_tensor_counts(self.describe())
    self.assertEqual((total, parts), (_TENSORS_READ, {"BF16": _TENSORS_READ}))

  def test_fp8_format_counts_add_up_to_the_total(self):
    text = self.describe(self.fp8_plan)
    total, parts = _source_tensor_counts(text)
    projections = 4 * 7  # q, k, v, o, gate, up, down of each of the 4 layers.
    self.assertEqual((total, parts), (_TENSORS_READ, {"BF16": _TENSORS_READ - projections,
                                                      "F8_E4M3 x F32 scales, 32x32 blocks": projections}))
    self.assertIn("; fp8 weights dequantized while streaming", text.splitlines()[0])
    query = next(line for line in text.splitlines() if line.startswith("decoder/layers/self_attention/query/kernel"))
    self.assertIn("F8_E4M3 x F32 scales, 32x32 blocks  model.layers.0.self_attn.q_proj.weight,", query)

  def test_every_leaf_has_a_row_with_its_shape_dtype_and_bytes(self):
    lines = self.describe().splitlines()
    self.assertEqual(lines[0], "qwen3 (Qwen3ForCausalLM) -> MaxText qwen3, scanned, float32")
    for leaf in self.plan.leaves:
      row = next(line for line in lines if line.split()[:1] == [leaf.name])
      self.assertIn(str(leaf.shape), row)
      self.assertIn(f"  float32   {leaf.nbytes:>12,}  BF16  {leaf.sources[0]}", row)
    self.assertIn(f"leaves:            {len(self.plan.leaves)}", lines)
    total = self.plan.total_bytes
    self.assertIn(f"bytes to write:    {total:,} ({total / 1024:.1f} KiB)", lines)

  def test_predicted_peak_is_the_baseline_plus_the_blocks_in_flight_with_overhead(self):
    largest = max(leaf.nbytes for leaf in self.plan.leaves)
    total = self.plan.total_bytes
    baseline = 1000 + dry_run.WRITER_BYTES
    predict = lambda budget: dry_run.predicted_peak_bytes(self.plan, 1000, budget)
    overhead = dry_run.INFLIGHT_OVERHEAD
    # A one-byte budget makes the writer cut the smallest blocks its loaders allow (one layer of a stacked leaf):
    # at least the largest of those is in flight.
    _, blocks, _, _ = lazy_leaves.write_blocks(self.plan, 1)
    smallest_cut = max(math.prod(b) * leaf.dtype.itemsize for leaf, b in zip(self.plan.leaves, blocks))
    self.assertLess(smallest_cut, largest)
    self.assertEqual(predict(1), int(baseline + overhead * smallest_cut))
    self.assertEqual(predict(10 * total), int(baseline + overhead * total))  # At most everything.
    between = (largest + total) // 2
    self.assertEqual(predict(between), int(baseline + overhead * between))
    # Read from the Hub: its connections' share besides (a source's own read cache is none here).
    on_hub = dataclasses.replace(self.plan, source=dataclasses.replace(self.plan.source, location="hf://o/n@c"))
    self.assertEqual(dry_run.predicted_peak_bytes(on_hub, 1000, between),
                     int(baseline + overhead * between) + hub.READ_OVERHEAD_BYTES)

  def test_shares_are_listed_only_for_several_processes(self):
    total = self.plan.total_bytes
    one = self.describe(shares=[total])
    self.assertNotIn("process 0 writes", one)
    several = self.describe(shares=[total // 4, total - total // 4]).splitlines()
    self.assertIn(f"process 0 writes: {total // 4:,} bytes ({(total // 4) / total:.1%})", several)
    self.assertIn(f"process 1 writes: {total - total // 4:,} bytes ({(total - total // 4) / total:.1%})", several)

  def test_warnings_and_budget_are_shown(self):
    lines = self.describe(max_inflight_bytes=512).splitlines()
    self.assertIn(f"warning: 1 unused tensor(s): {_UNUSED}", lines)
    self.assertTrue(any(line.startswith("predicted peak RSS:") and line.endswith("(budget 512 B)") for line in lines))

  @parameterized.parameters((0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (3 << 30, "3.0 GiB"),
                            (5 << 40, "5.0 TiB"), (5 << 50, "5120.0 TiB"))
  def test_budget_in_human_units(self, nbytes, shown):
    self.assertIn(f"(budget {shown})", self.describe(max_inflight_bytes=nbytes))


if __name__ == "__main__":
  absltest.main()
