"""LoRA adapters both ways on tiny random models, against transformers + peft 0.21.2.

Merge (--lora_adapter_path): the converted checkpoint's logits equal transformers' with the adapter merged by
peft (`merge_and_unload`), while the base model's logits, and those of the adapter at the scale MaxText's own
merge would use, are far off (a dropped adapter or a wrong scale fails); bad adapters are refused by the binary
with one message naming the file, module and reason, leaving nothing behind. Export (--export=lora_adapter): a
MaxText LoRA checkpoint written as MaxText 0.2.5's LoRA training lays it out becomes a PEFT adapter that peft
loads, whose logits are the original adapter's, and whose factors are the original ones.
"""

from __future__ import annotations

import json
import os
import re
import shutil

from absl.testing import absltest

from integration_tests import harness
from tools import hub_stand_in

harness.start_jax()

import numpy as np  # pylint: disable=g-import-not-at-top,g-bad-import-order
from safetensors import numpy as safetensors_numpy  # pylint: disable=g-import-not-at-top
from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top

from converter.checkpoint_format.record import ConversionRecord  # pylint: disable=g-import-not-at-top
from tools import lora_adapters, validate_lib  # pylint: disable=g-import-not-at-top
from tools.testing import tiny_models

THRESHOLDS = validate_lib.Thresholds()  # The float32 bar (its defaults).
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def _ids(model_dir: str) -> np.ndarray:
  return validate_lib.token_ids(validate_lib.load_model_config(model_dir).vocab_size, 2, 32, 0)


def _with_config(adapter_dir: str, **changes) -> str:
  """A copy of the adapter with its adapter_config.json changed."""
  copy = harness.scratch_dir("adapter-")
  shutil.copy(os.path.join(adapter_dir, ADAPTER_WEIGHTS), copy)
  with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
    config = json.load(f)
  with open(os.path.join(copy, "adapter_config.json"), "w") as f:
    json.dump(dict(config, **changes), f)
  return copy


class LoraMergeTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = tiny_models.build_tiny_model("qwen3", harness.scratch_dir("qwen3-hf-"))

  def _assert_merged(self, model: str, spec: lora_adapters.AdapterSpec, scan: bool, wrong: dict) -> str:
    """Converts `model` with a fresh adapter; its logits match peft's merge, and not the base's nor those of the
    adapter with `wrong` config changes; returns the items path."""
    ids = _ids(model)
    adapter = lora_adapters.make_adapter(model, harness.scratch_dir("adapter-"), spec)
    reference = lora_adapters.merged_logits(model, adapter, ids)
    items = harness.converted(model, "--save_dtype=float32", f"--scan_layers={scan}",
                              f"--lora_adapter_path={adapter}", "--simulated_cpu_devices_count=1")
    checked = validate_lib.checkpoint_logits(model, items, ids)
    self.assertEqual(checked.device_restore_failures, ())
    accelerator = validate_lib.accelerator_forward(checked)  # None on the CPU suite.
    self.assertEqual(accelerator.failures() if accelerator else [], [])
    ours = checked.logits
    report = validate_lib.compare_logits(ours, reference)
    self.assertLessEqual(report[0], THRESHOLDS.max_abs_diff, report)
    self.assertEqual(report[2], 1.0, report)
    wrong_reference = lora_adapters.merged_logits(model, _with_config(adapter, **wrong), ids)
    base = validate_lib.reference_logits(model, ids)
    for name, other in (("the base model", base), (f"the adapter with {wrong}", wrong_reference)):
      with self.subTest(against=name):
        self.assertGreater(validate_lib.compare_logits(ours, other)[0], 100 * THRESHOLDS.max_abs_diff)
    record = ConversionRecord.read(items).lora_adapter
    self.assertEqual((record["path"], record["r"], record["lora_alpha"], record["use_rslora"]),
                     (adapter, spec.r, spec.lora_alpha, spec.use_rslora))
    self.assertLen(record["modules"], validate_lib.load_model_config(model).num_layers * len(spec.target_modules))
    return items

  def test_merged_matches_peft(self):
    # r 4, alpha 12 (scale 3), every attention and MLP projection; wrong: merged without alpha / r.
    self._assert_merged(self.model, lora_adapters.AdapterSpec(), scan=False, wrong=dict(lora_alpha=4))

  def test_rslora_and_patterns_match_peft_llama31(self):
    # Llama 3.1: the merged q/k weights then take the RoPE permutation and the query scale, as unmerged ones do.
    model = tiny_models.build_tiny_model("llama3.1", harness.scratch_dir("llama3.1-hf-"))
    spec = lora_adapters.AdapterSpec(use_rslora=True, rank_pattern={"q_proj": 8, r"layers\.1\.mlp\.down_proj": 2},
                                     alpha_pattern={"o_proj": 5.0, "layers.3.mlp.up_proj": 20.0})
    items = self._assert_merged(model, spec, scan=True, wrong=dict(use_rslora=False))  # MaxText ignores rsLoRA.
    modules = ConversionRecord.read(items).lora_adapter["modules"]
    self.assertEqual(modules["model.layers.0.self_attn.q_proj"]["r"], 8)
    self.assertEqual(modules["model.layers.1.mlp.down_proj"]["r"], 2)
    self.assertEqual(modules["model.layers.2.mlp.down_proj"]["r"], 4)
    self.assertEqual(modules["model.layers.3.mlp.up_proj"]["scale"], 10.0)  # 20 / sqrt(4).

  def test_bad_adapters_are_refused(self):
    good = lora_adapters.make_adapter(self.model, harness.scratch_dir("adapter-"),
                                      lora_adapters.AdapterSpec(target_modules=("q_proj",)))
    dora = _with_config(good, use_dora=True)
    harness.assert_refused(self, self.model, os.path.join(dora, "adapter_config.json"), "use_dora", "magnitude",
                           flags=(f"--lora_adapter_path={dora}",))
    # An adapter of another model: its factors do not fit the base weight.
    other = tiny_models.build_tiny_model("llama3", harness.scratch_dir("llama3-hf-"))
    foreign = lora_adapters.make_adapter(other, harness.scratch_dir("adapter-"),
                                         lora_adapters.AdapterSpec(target_modules=("q_proj",)))
    harness.assert_refused(self, self.model, os.path.join(foreign, ADAPTER_WEIGHTS),
                           "'model.layers.0.self_attn.q_proj'", "but the base weight", "has shape",
                           flags=(f"--lora_adapter_path={foreign}",))
    # A target the family does not convert (a stray tensor, accepted by --allow_unused_tensors) would be lost.
    stray = "model.layers.8.self_attn.q_proj"
    tensors = load_file(os.path.join(self.model, "model.safetensors"))
    tensors[stray + ".weight"] = tensors["model.layers.0.self_attn.q_proj.weight"]
    variant = harness.scratch_dir("variant-")
    save_file(tensors, os.path.join(variant, "model.safetensors"))
    shutil.copy(os.path.join(self.model, "config.json"), variant)
    factors = load_file(os.path.join(good, ADAPTER_WEIGHTS))
    for side in ("A", "B"):
      factors[f"base_model.model.{stray}.lora_{side}.weight"] = factors[
          f"base_model.model.model.layers.0.self_attn.q_proj.lora_{side}.weight"]
    unread = _with_config(good)
    save_file(factors, os.path.join(unread, ADAPTER_WEIGHTS))
    harness.assert_refused(self, variant, os.path.join(unread, ADAPTER_WEIGHTS), repr(stray),
                           "does not convert", "would be lost",
                           flags=(f"--lora_adapter_path={unread}", "--allow_unused_tensors"))


class LoraExportTest(absltest.TestCase):
  """MaxText LoRA checkpoint -> PEFT adapter -> peft."""

  def _assert_exported(self, row: str, scan: bool, nnx_layout: bool, unrecorded_alpha: bool = False,
                       **tree_options) -> None:
    model = tiny_models.build_tiny_model(row, harness.scratch_dir(f"{row}-hf-"))
    ids = _ids(model)
    adapter = lora_adapters.make_adapter(model, harness.scratch_dir("adapter-"))
    config = validate_lib.load_model_config(model)
    items = lora_adapters.write_maxtext_lora_checkpoint(
        adapter, harness.scratch_dir("maxtext-lora-"), num_layers=config.num_layers, scan_layers=scan,
        nnx_layout=nnx_layout, **tree_options)
    exported = os.path.join(harness.scratch_dir("exported-"), "adapter")
    flags = ("--direction=to_huggingface", "--export=lora_adapter", f"--checkpoint_path={items}",
             f"--hf_config_path={model}", f"--output_dir={exported}")
    if unrecorded_alpha:  # As a saver that records no `lora` metadata leaves it: the alpha must be given.
      metadata_path = os.path.join(os.path.dirname(items), "_CHECKPOINT_METADATA")
      with open(metadata_path) as f:
        metadata = json.load(f)
      del metadata["custom_metadata"]["lora"]
      with open(metadata_path, "w") as f:
        json.dump(metadata, f)
      refused = harness.run_converter(*flags, check=False)
      self.assertEqual(refused.returncode, 1)
      self.assertIn("pass --lora_alpha", refused.stderr)
      self.assertFalse(os.path.exists(exported))
      flags += ("--lora_alpha=12",)
    harness.run_converter(*flags)
    original, back = (load_file(os.path.join(d, ADAPTER_WEIGHTS)) for d in (adapter, exported))
    self.assertEqual(sorted(back), sorted(original))
    for name, value in original.items():  # Equal, or within one ulp where the query scale was undone.
      np.testing.assert_allclose(back[name], value, rtol=2 ** -22, atol=0, err_msg=name)
    with open(os.path.join(exported, "adapter_config.json")) as f:
      adapter_config = json.load(f)
    self.assertEqual((adapter_config["r"], adapter_config["lora_alpha"]), (4, 12.0))
    reference = lora_adapters.merged_logits(model, adapter, ids)
    applied = lora_adapters.merged_logits(model, exported, ids, merge=False)
    report = validate_lib.compare_logits(applied, reference)
    self.assertLessEqual(report[0], THRESHOLDS.max_abs_diff, report)
    self.assertGreater(validate_lib.compare_logits(applied, validate_lib.reference_logits(model, ids))[0], 0.1)

  def test_llama31_scanned(self):
    # RoPE interleave on the q/k output side and the query scale undone; the layer axis at 1.
    head_dim = tiny_models.TINY_MODELS["llama3.1"].config["head_dim"]
    self._assert_exported("llama3.1", scan=True, nnx_layout=False, head_dim=head_dim, interleave_rope=True,
                          query_scale=head_dim ** -0.5)

  def test_qwen3_unscanned_nnx_state(self):
    self._assert_exported("qwen3", scan=False, nnx_layout=True, unrecorded_alpha=True,
                          head_dim=tiny_models.TINY_MODELS["qwen3"].config["head_dim"])


class LoraAdapterOnlyTest(absltest.TestCase):
  """PEFT adapter -> MaxText LoRA checkpoint (--lora_adapter_only); MaxText's own restore of it is in the interop
  step (run_interop's `peft->lora` case: MaxText's LoRA forward against peft's)."""

  def test_llama31_factors_come_back_through_the_export_and_patterns_are_refused(self):
    # Llama 3.1: the RoPE interleave and the query scale land on lora_b as MaxText's kernels have them.
    model = tiny_models.build_tiny_model("llama3.1", harness.scratch_dir("llama-hf-"))
    adapter = lora_adapters.make_adapter(model, harness.scratch_dir("adapter-"))
    original = load_file(os.path.join(adapter, ADAPTER_WEIGHTS))
    for scan in (True, False):
      out = os.path.join(harness.scratch_dir("lora-checkpoint-"), "out")
      result = harness.run_converter(f"--hf_model_path={model}", f"--lora_adapter_path={adapter}",
                                     "--lora_adapter_only", f"--scan_layers={scan}", "--save_dtype=float32",
                                     f"--output_dir={out}")
      items = os.path.join(out, "0", "items")
      # MaxText's SFT applies LoRA before reading the checkpoint's metadata: the line carries rank and alpha.
      self.assertIn(f"lora.enable_lora=true lora.lora_rank=4 lora.lora_alpha=12 lora.lora_restore_path={items}",
                    result.stdout)
      with open(os.path.join(out, "0", "_CHECKPOINT_METADATA")) as f:
        self.assertEqual(json.load(f)["custom_metadata"]["lora"], {"lora_rank": 4, "lora_alpha": 12.0})
      export = ("--direction=to_huggingface", "--export=lora_adapter", f"--checkpoint_path={items}",
                f"--hf_config_path={model}")
      if scan:
        exported = os.path.join(harness.scratch_dir("exported-"), "adapter")
        harness.run_converter(*export, f"--output_dir={exported}")
        back = load_file(os.path.join(exported, ADAPTER_WEIGHTS))
      else:  # The same export pushed to a Hub repo: the adapter's two files, in one commit.
        with hub_stand_in.HubStandIn({}) as hub:
          harness.run_converter(*export, "--output_dir=hf://tiny-org/tiny-adapter",
                                env={"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": "hf_test",
                                     "HF_HUB_OFFLINE": "0"})  # The suites set it; the stand-in is on 127.0.0.1.
          files = hub.files("tiny-org/tiny-adapter")
          self.assertLen(hub.commits, 1)
        self.assertEqual(sorted(files), [ADAPTER_CONFIG, ADAPTER_WEIGHTS])
        self.assertEqual(json.loads(files[ADAPTER_CONFIG])["r"], 4)
        back = safetensors_numpy.load(files[ADAPTER_WEIGHTS])
      self.assertEqual(sorted(back), sorted(original))
      for name, value in original.items():  # The query scale applied then undone: within one ulp.
        np.testing.assert_allclose(back[name], value, rtol=2 ** -22, atol=0, err_msg=name)
    rslora = lora_adapters.make_adapter(model, harness.scratch_dir("adapter-"),
                                        lora_adapters.AdapterSpec(use_rslora=True))
    out = os.path.join(harness.scratch_dir("refused-"), "out")
    result = harness.run_converter(f"--hf_model_path={model}", f"--lora_adapter_path={rslora}", "--lora_adapter_only",
                                   f"--output_dir={out}", check=False)
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertIn("use_rslora scales by alpha / sqrt(r)", result.stderr)
    self.assertFalse(os.path.exists(os.path.join(out, "0")))


class LoraMergedBackTest(absltest.TestCase):
  """MaxText base + MaxText LoRA checkpoint -> one full HF model (--lora_checkpoint_path), against peft's merge, and
  -> one MaxText checkpoint (--direction=to_maxtext), against the HF merge."""

  def test_merged_back_matches_peft_and_a_mismatched_checkpoint_is_refused(self):
    model = tiny_models.build_tiny_model("qwen3", harness.scratch_dir("qwen3-hf-"))
    ids = _ids(model)
    adapter = lora_adapters.make_adapter(model, harness.scratch_dir("adapter-"))
    head_dim = tiny_models.TINY_MODELS["qwen3"].config["head_dim"]
    config = validate_lib.load_model_config(model)
    lora = lora_adapters.write_maxtext_lora_checkpoint(adapter, harness.scratch_dir("maxtext-lora-"),
                                                       num_layers=config.num_layers, scan_layers=False,
                                                       nnx_layout=True, head_dim=head_dim)
    base = harness.converted(model, "--save_dtype=float32", "--simulated_cpu_devices_count=1")  # Scanned.
    merged = os.path.join(harness.scratch_dir("merged-"), "hf")
    result = harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={base}",
                                   f"--lora_checkpoint_path={lora}", f"--output_dir={merged}")
    self.assertIn("lora:          ", result.stdout)
    logits = validate_lib.reference_logits(merged, ids)
    report = validate_lib.compare_logits(logits, lora_adapters.merged_logits(model, adapter, ids))
    self.assertLessEqual(report[0], THRESHOLDS.max_abs_diff, report)
    self.assertGreater(validate_lib.compare_logits(logits, validate_lib.reference_logits(model, ids))[0], 0.1)
    # The same merge into a MaxText checkpoint (--direction=to_maxtext, laid out unscanned): its weights are those
    # merged on the way back (the same float32 sums, in MaxText's axes), and it records the LoRA checkpoint.
    relaid = harness.scratch_dir("merged-maxtext-")
    result = harness.run_converter(f"--checkpoint_path={base}", f"--lora_checkpoint_path={lora}",
                                   f"--output_dir={relaid}", "--scan_layers=false", "--save_dtype=float32", "--verify")
    spec = lora_adapters.AdapterSpec()
    self.assertRegex(result.stdout, rf"lora: +\d+ modules merged, r {spec.r}, lora_alpha {spec.lora_alpha:g}, from .*"
                                    rf"{re.escape(lora)}")
    record = ConversionRecord.read(os.path.join(relaid, "0", "items"))
    self.assertEqual((record.scan_layers, record.lora_adapter["r"]), (False, lora_adapters.AdapterSpec().r))
    back = os.path.join(harness.scratch_dir("merged-maxtext-hf-"), "hf")
    harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={relaid}/0/items", f"--output_dir={back}")
    expected = load_file(os.path.join(merged, "model.safetensors"))
    got = load_file(os.path.join(back, "model.safetensors"))
    self.assertEqual(sorted(got), sorted(expected))
    for name, value in expected.items():  # The query scale undone on the way back: within one ulp.
      np.testing.assert_allclose(got[name], value, rtol=2 ** -22, atol=0, err_msg=name)
    # Factors of another model's shapes (Llama 3.1's tiny row) are refused by leaf, nothing written.
    other = tiny_models.build_tiny_model("llama3.1", harness.scratch_dir("llama-hf-"))
    other_lora = lora_adapters.write_maxtext_lora_checkpoint(
        lora_adapters.make_adapter(other, harness.scratch_dir("adapter-")), harness.scratch_dir("maxtext-lora-"),
        num_layers=validate_lib.load_model_config(other).num_layers, scan_layers=True,
        head_dim=tiny_models.TINY_MODELS["llama3.1"].config["head_dim"])
    refused = os.path.join(harness.scratch_dir("refused-"), "hf")
    result = harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={base}",
                                   f"--lora_checkpoint_path={other_lora}", f"--output_dir={refused}", check=False)
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertIn("kernel_lora_a has shape", result.stderr)
    self.assertFalse(os.path.exists(refused))
    result = harness.run_converter(f"--checkpoint_path={base}", f"--lora_checkpoint_path={other_lora}",
                                   f"--output_dir={refused}", check=False)
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertIn("kernel_lora_a has shape", result.stderr)
    self.assertFalse(os.path.exists(os.path.join(refused, "0")))


if __name__ == "__main__":
  absltest.main()
