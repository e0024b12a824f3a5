"""Every family's MaxText tree (paths, shapes, the HF tensors each leaf reads) and recorded overrides, pinned.

No weights: each tiny model of tools/testing/tiny_models.py is planned from its config.json (as transformers writes it)
against a header-only source that holds exactly the tensors the layout names, scanned and unscanned, and the
result is compared with `testdata/<model>.golden`. A layout change shows up here as a readable diff before any
logits are computed; after an intended change, regenerate with

  UPDATE_GOLDENS=1 PYTHONPATH=. .venv/bin/python converter/families/golden_test.py

and review the diff. The goldens were checked leaf by leaf against MaxText 0.2.5's own parameter trees by the
interop step (integration_tests/maxtext_interop), which runs the same tiny models.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os

import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized

from converter import families
from converter.model_config import parse_model_config
from converter.options import PlanOptions
from converter.planning.plan import build_plan
from tools.testing import tiny_models

GOLDEN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata")


@dataclasses.dataclass(frozen=True)
class HeaderOnlyTensor:
  """A tensor with a name, shape and dtype and nothing to read: enough to plan."""

  name: str
  shape: tuple[int, ...]
  dtype: np.dtype = np.dtype(ml_dtypes.bfloat16)
  format: str = "BF16"
  files: tuple[str, ...] = ("<header only>",)
  byte_ranges: tuple[tuple[str, int, int], ...] = ()

  @property
  def stored_names(self) -> tuple[str, ...]:
    return (self.name,)

  def read(self, dtype=None, region=(), transpose=False):
    raise AssertionError(f"{self.name}: a golden test reads no weights")


@dataclasses.dataclass(frozen=True)
class HeaderOnlySource:
  tensors: dict[str, HeaderOnlyTensor]
  location: str = "<header only>"
  quant_method: str | None = None

  @property
  def files(self) -> list[str]:
    return ["<header only>"]


def _hf_tensors(model: families.ResolvedModel, scan_layers: bool) -> dict[str, HeaderOnlyTensor]:
  layout = model.layout(model.config.vocab_size, scan_layers)
  tensors = {}
  for param in layout.top:
    tensors[param.hf] = HeaderOnlyTensor(param.hf, tuple(param.hf_shape))
  for group in layout.groups:
    group = group.resolved()
    for param in (p for p in group.params if p.constant is None):
      for _, layer in group.positions():
        for expert in range(param.experts) if param.experts and not param.experts_in_tensor else [None]:
          name = param.hf.format(layer=param.hf_layer(layer), expert=expert)
          tensors[name] = HeaderOnlyTensor(name, tuple(param.hf_shape))
  return tensors


def describe(model_name: str) -> str:
  config = parse_model_config(tiny_models.config_json(model_name), f"{model_name}/config.json")
  model = families.resolve(config)
  lines = [f"# {model_name}: family {model.family.name}, target {model.target}"]
  for scan_layers in tiny_models.TINY_MODELS[model_name].scans:  # Gemma 4 small: unscanned only.
    plan = build_plan(HeaderOnlySource(_hf_tensors(model, scan_layers)), model,
                      PlanOptions(scan_layers=scan_layers, save_dtype="bfloat16"))
    lines.append(f"## scan_layers={str(scan_layers).lower()}")
    lines.append("overrides: " + json.dumps(plan.runtime.config.overrides(), sort_keys=True))
    for leaf in plan.leaves:
      sources = (leaf.sources[0] + (f" (+{len(leaf.sources) - 1})" if len(leaf.sources) > 1 else "")
                 if leaf.sources else "(no HF tensor: a constant)")
      lines.append(f"{leaf.name} {leaf.shape} <- {sources}")
  return "\n".join(lines) + "\n"


class GoldenTest(parameterized.TestCase):

  # FP8 rows convert with --keep_fp8, which needs the stored block scales: pinned in quantized_test instead.
  @parameterized.parameters(*(m for m, spec in tiny_models.TINY_MODELS.items() if not spec.fp8))
  def test_tree_and_overrides_match_the_golden(self, model):
    path = os.path.join(GOLDEN_DIR, f"{model}.golden")
    actual = describe(model)
    if os.environ.get("UPDATE_GOLDENS"):
      os.makedirs(GOLDEN_DIR, exist_ok=True)
      with open(path, "w") as f:
        f.write(actual)
    self.assertTrue(os.path.exists(path), f"{path} is missing: run with UPDATE_GOLDENS=1 (see the module docstring)")
    with open(path) as f:
      expected = f.read()
    diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True), path, "now"))
    self.assertEqual(diff, "", f"{model}'s tree differs from its golden:\n{diff}")


if __name__ == "__main__":
  absltest.main()
