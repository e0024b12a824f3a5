"""Every family, as a random tiny transformers model, converted at devices {1, 16} x scan {on, off} (lazy,
float32) and compared with transformers' logits; plus the family-specific ways a conversion goes wrong.
"""

from __future__ import annotations

import itertools
import json
import os

from absl.testing import absltest, parameterized

from integration_tests import harness

harness.start_jax()

import numpy as np  # pylint: disable=g-import-not-at-top,g-bad-import-order

from tools import checkpoint_io, tiny_models, validate_lib  # pylint: disable=g-import-not-at-top

THRESHOLDS = validate_lib.Thresholds(max_abs_diff=1e-4, min_cosine=0.99999, min_argmax_agreement=1.0)
# (tiny model, expected family, expected inferred target)
FAMILY_ROWS = [
    ("llama2", "llama", "llama2"),
    ("llama3", "llama", "llama3"),
    ("llama3.1", "llama", "llama3.1"),
    ("llama3.2_tied", "llama", "llama3.1"),
    ("mistral", "mistral", "mistral"),
    ("qwen2", "qwen2", "qwen2.5"),
    ("qwen3", "qwen3", "qwen3"),
    ("qwen3_moe", "qwen3_moe", "qwen3"),
    ("mixtral", "mixtral", "mixtral"),
    ("gemma", "gemma", "gemma"),
    ("gemma2", "gemma2", "gemma2"),
    ("gemma3", "gemma3", "gemma3-4b"),
]
CELLS = [
    dict(testcase_name=f"{model.replace('.', '_')}_devices{d}_{'scan' if s else 'noscan'}", model=model, family=family, target=target,
         devices=d, scan=s)
    for (model, family, target), d, s in itertools.product(FAMILY_ROWS, (1, 16), (True, False))
]

_models: dict[str, tuple[str, np.ndarray]] = {}


def tiny_model(name: str) -> tuple[str, np.ndarray]:
  """The model's directory and its transformers reference logits, built once per test process."""
  if name not in _models:
    model_dir = tiny_models.build_tiny_model(name, harness.scratch_dir(f"{name}-hf-"))
    config = validate_lib.load_model_config(model_dir)
    ids = validate_lib.token_ids(config.vocab_size, 2, 32, 0)
    _models[name] = (model_dir, validate_lib.reference_logits(model_dir, ids))
  return _models[name]


def convert(model_dir: str, *flags: str) -> str:
  out = harness.scratch_dir("mt-")
  harness.run_converter(f"--hf_model_path={model_dir}", f"--output_dir={out}", "--save_dtype=float32", *flags)
  return os.path.join(out, "0", "items")


class FamiliesTest(parameterized.TestCase):

  @parameterized.named_parameters(*CELLS)
  def test_logits_match_transformers(self, model, family, target, devices, scan):
    model_dir, reference = tiny_model(model)
    items = convert(model_dir, f"--simulated_cpu_devices_count={devices}", f"--scan_layers={scan}")
    info = checkpoint_io.custom_metadata(items)["hf2maxtext"]
    self.assertEqual((info["family"], info["target_model"]), (family, target))
    report = validate_lib.validate(model_dir, items, reference=reference)
    self.assertEqual(report.failures(THRESHOLDS), [], report)

  def test_wrong_target_is_caught_by_validator(self):
    # A Llama-3.1 checkpoint converted for MaxText's llama3 decoder: no rope permutation, no llama3 scaling.
    model_dir, reference = tiny_model("llama3.1")
    items = convert(model_dir, "--simulated_cpu_devices_count=1", "--target_model=llama3-8b")
    report = validate_lib.validate(model_dir, items, reference=reference)
    self.assertNotEqual(report.failures(THRESHOLDS), [])

  def test_llama31_kernels_are_permuted_and_scaled(self):
    from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

    model_dir, _ = tiny_model("llama3.1")
    items = convert(model_dir, "--simulated_cpu_devices_count=1", "--scan_layers=false")
    layer = checkpoint_io.restore_v0(items)["params"]["params"]["decoder"]["layers_0"]["self_attention"]
    hf = load_file(os.path.join(model_dir, "model.safetensors"))
    q = hf["model.layers.0.self_attn.q_proj.weight"].T.reshape(192, 6, 40)
    interleaved = np.stack([q[..., :20], q[..., 20:]], axis=-1).reshape(q.shape)
    expected = (interleaved.astype(np.float32) * np.float32(1 / np.sqrt(40))).astype(np.float32)
    np.testing.assert_array_equal(layer["query"]["kernel"], expected)
    k = hf["model.layers.0.self_attn.k_proj.weight"].T.reshape(192, 2, 40)
    np.testing.assert_array_equal(layer["key"]["kernel"], np.stack([k[..., :20], k[..., 20:]], -1).reshape(k.shape))

  def test_scanned_experts_are_experts_first_then_layers(self):
    from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

    model_dir, _ = tiny_model("qwen3_moe")
    items = convert(model_dir, "--simulated_cpu_devices_count=1")
    moe = checkpoint_io.restore_v0(items)["params"]["params"]["decoder"]["layers"]["moe_block"]
    self.assertEqual(moe["wi_0"].shape, (6, 4, 192, 96))
    self.assertEqual(moe["wo"].shape, (6, 4, 96, 192))
    self.assertEqual(moe["gate"]["kernel"].shape, (192, 4, 6))
    hf = load_file(os.path.join(model_dir, "model.safetensors"))
    np.testing.assert_array_equal(moe["wi_1"][5, 3], hf["model.layers.3.mlp.experts.5.up_proj.weight"].T)
    np.testing.assert_array_equal(moe["wo"][2, 1], hf["model.layers.1.mlp.experts.2.down_proj.weight"].T)

  def test_vocab_padding(self):
    model_dir, reference = tiny_model("llama3.2_tied")
    items = convert(model_dir, "--simulated_cpu_devices_count=1", "--target_vocab_size=512")
    embedding = checkpoint_io.restore_v0(items)["params"]["params"]["token_embedder"]["embedding"]
    self.assertEqual(embedding.shape, (512, 192))
    np.testing.assert_array_equal(embedding[509:], 0)
    report = validate_lib.validate(model_dir, items, reference=reference)
    self.assertEqual(report.failures(THRESHOLDS), [], report)
    overrides = checkpoint_io.custom_metadata(items)["hf2maxtext"]["maxtext_overrides"]
    self.assertEqual((overrides["vocab_size"], overrides["logits_via_embedding"]), (512, True))

  @parameterized.named_parameters(("tied_flag_with_lm_head", True), ("untied_flag_without_lm_head", False))
  def test_tie_word_embeddings_contradicting_tensors_is_refused(self, claim_tied):
    model_dir, _ = tiny_model("llama3" if claim_tied else "llama3.2_tied")
    broken = harness.scratch_dir("contradiction-")
    for name in os.listdir(model_dir):
      os.symlink(os.path.join(model_dir, name), os.path.join(broken, name))
    os.remove(os.path.join(broken, "config.json"))
    with open(os.path.join(model_dir, "config.json")) as f:
      config = json.load(f)
    config["tie_word_embeddings"] = claim_tied
    with open(os.path.join(broken, "config.json"), "w") as f:
      json.dump(config, f)
    out = harness.scratch_dir("mt-")
    result = harness.run_converter(f"--hf_model_path={broken}", f"--output_dir={out}", check=False)
    self.assertEqual(result.returncode, 1, result.stderr)
    self.assertIn("tie_word_embeddings", result.stderr)
    self.assertIn("lm_head.weight", result.stderr)
    self.assertFalse(os.path.exists(os.path.join(out, "0")))

  def test_unsupported_architecture_lists_supported_ones(self):
    model_dir, _ = tiny_model("qwen3")
    broken = harness.scratch_dir("unsupported-")
    with open(os.path.join(model_dir, "config.json")) as f:
      config = json.load(f)
    config["architectures"] = ["FalconForCausalLM"]
    with open(os.path.join(broken, "config.json"), "w") as f:
      json.dump(config, f)
    result = harness.run_converter(f"--hf_model_path={broken}", f"--output_dir={broken}/out", check=False)
    self.assertEqual(result.returncode, 1)
    self.assertIn("FalconForCausalLM", result.stderr)
    for supported in ("LlamaForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM"):
      self.assertIn(supported, result.stderr)


if __name__ == "__main__":
  absltest.main()
