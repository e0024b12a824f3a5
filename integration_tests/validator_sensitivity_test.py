"""The validator must reject conversions that keep every name and shape but move values.

A gate/up swap, swapped q/k norms, a norm read from the wrong tensor: each is a real converter bug that loads
in MaxText without complaint. Each is injected here into the family description and must fail. (A wrongly baked
query scale is invisible in Qwen3's logits, since its q-norm absorbs it; conversion_matrix_test checks the query
kernel's exact values instead.)
"""

from __future__ import annotations

import dataclasses
import os

from absl.testing import absltest, parameterized

from integration_tests import harness

harness.start_jax()

from converter import families  # pylint: disable=g-import-not-at-top,g-bad-import-order
from converter.options import PlanOptions, SaveOptions  # pylint: disable=g-import-not-at-top
from converter.output import orbax_writer  # pylint: disable=g-import-not-at-top
from converter.output.destinations import destination_for  # pylint: disable=g-import-not-at-top
from converter.families import Layout
from converter.model_config import load_model_config
from converter.planning.plan import build_plan
from converter.sources import open_source
from converter.verify import verify_checkpoint
from tools import validate_lib
from tools.testing import tiny_models


def _swap_hf_names(layout: Layout, a: str, b: str) -> Layout:
  def swap(group):
    by_path = {p.maxtext: p for p in group.params}
    swapped = {a: dataclasses.replace(by_path[a], hf=by_path[b].hf),
               b: dataclasses.replace(by_path[b], hf=by_path[a].hf)}
    return dataclasses.replace(group, params=tuple(swapped.get(p.maxtext, p) for p in group.params))

  return dataclasses.replace(layout, groups=tuple(swap(g) for g in layout.groups))


def _gate_up_swapped(layout: Layout) -> Layout:
  return _swap_hf_names(layout, "mlp/wi_0/kernel", "mlp/wi_1/kernel")


def _query_norm_key_norm_swapped(layout: Layout) -> Layout:
  return _swap_hf_names(layout, "self_attention/query_norm/scale", "self_attention/key_norm/scale")


def _final_norm_dropped_to_ones(layout: Layout) -> Layout:
  # The norm read from the first layer's input norm instead: same shape, wrong values.
  top = tuple(
      dataclasses.replace(p, hf="model.layers.0.input_layernorm.weight") if p.maxtext == "decoder/decoder_norm/scale"
      else p for p in layout.top
  )
  return dataclasses.replace(layout, top=top)


class ValidatorSensitivityTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model_dir = tiny_models.build_tiny_model("qwen3", harness.scratch_dir("qwen3-hf-"))
    config = load_model_config(cls.model_dir)
    cls.reference = validate_lib.reference_logits(
        cls.model_dir, validate_lib.token_ids(config.vocab_size, 2, 32, 0)
    )

  def _plan(self, mutate=lambda layout: layout, **kwargs):
    config = load_model_config(self.model_dir)
    model = families.resolve(config)
    broken = dataclasses.replace(model.family, layout=lambda *args: mutate(model.family.layout(*args)))
    return build_plan(open_source(self.model_dir, config.raw, config.path), dataclasses.replace(model, family=broken),
                      PlanOptions(scan_layers=True, save_dtype="float32", **kwargs))

  def _convert_with(self, mutate) -> str:
    plan = self._plan(mutate, allow_unused_tensors=True)
    out = harness.scratch_dir("broken-")
    orbax_writer.save(plan, destination_for(out), SaveOptions(lazy=True, devices=1, max_inflight_bytes=1 << 30),
                      custom_metadata={"scan_layers": True, "hf2maxtext": {
                          "family": "qwen3", "target_model": "qwen3",
                          "maxtext_overrides": plan.runtime.config.overrides()}})
    return os.path.join(out, "0", "items")

  def test_correct_conversion_passes(self):
    report = validate_lib.validate(self.model_dir, self._convert_with(lambda layout: layout), reference=self.reference)
    self.assertEqual(report.failures(validate_lib.Thresholds()), [])

  @parameterized.named_parameters(
      ("gate_up_swap", _gate_up_swapped),
      ("query_key_norm_swap", _query_norm_key_norm_swapped),
      ("final_norm_from_wrong_tensor", _final_norm_dropped_to_ones),
  )
  def test_same_shape_mistake_is_rejected(self, mutate):
    report = validate_lib.validate(self.model_dir, self._convert_with(mutate), reference=self.reference)
    self.assertNotEqual(report.failures(validate_lib.Thresholds()), [], report)


  def test_verify_names_the_leaves_that_differ_from_the_source(self):
    items = self._convert_with(_gate_up_swapped)
    correct = self._plan()
    report = verify_checkpoint(correct, items)
    self.assertEqual(sorted(m.split(" ")[0] for m in report.mismatches),
                     ["decoder/layers/mlp/wi_0/kernel", "decoder/layers/mlp/wi_1/kernel"])
    self.assertEqual(verify_checkpoint(correct, self._convert_with(lambda layout: layout)).mismatches, ())


if __name__ == "__main__":
  absltest.main()
