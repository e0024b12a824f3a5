"""Every family, as a random tiny transformers model, converted at devices {1, 16} x scan {on, off} (lazy,
float32) and compared with transformers' logits; plus the family-specific ways a conversion goes wrong.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os

from absl.testing import absltest, parameterized

from integration_tests import harness

harness.start_jax()

import numpy as np  # pylint: disable=g-import-not-at-top,g-bad-import-order

from converter.checkpoint_format.record import ConversionRecord  # pylint: disable=g-import-not-at-top
from tools import checkpoint_io, quantize, validate_lib  # pylint: disable=g-import-not-at-top
from tools.testing import tiny_models

THRESHOLDS = validate_lib.Thresholds()  # The float32 bar (its defaults).
# Every tiny model but the Qwen3-30B-A3B structure (qwen3_moe again, with a test of its own in roundtrip_test).
FAMILY_ROWS = [(name, spec.family, spec.target) for name, spec in tiny_models.TINY_MODELS.items()
               if name != "qwen3_30b_a3b_tiny"]
CELLS = [
    dict(testcase_name=f"{model.replace('.', '_')}_devices{d}_{'scan' if s else 'noscan'}", model=model,
         family=family, target=target, devices=d, scan=s)
    for (model, family, target), d, s in itertools.product(FAMILY_ROWS, (1, 16), (True, False))
    if s in tiny_models.TINY_MODELS[model].scans
    # Multimodal rows: text logits through their decoder once here; image + text in the MaxText interop step.
    and (not tiny_models.TINY_MODELS[model].inputs or (d, s) == (16, tiny_models.TINY_MODELS[model].scans[-1]))
]

_models: dict[str, tuple[str, np.ndarray]] = {}


def tiny_model(name: str) -> tuple[str, np.ndarray]:
  """The model's directory and its transformers reference logits, built once per test process."""
  if name not in _models:
    model_dir = tiny_models.build_tiny_model(name, harness.scratch_dir(f"{name}-hf-"))
    config = validate_lib.load_model_config(model_dir)
    ids = validate_lib.token_ids(config.vocab_size, 2, _seq_len(name), 0)
    _models[name] = (model_dir, validate_lib.reference_logits(model_dir, ids))
  return _models[name]


def _seq_len(name: str) -> int:
  """Tokens per sequence: the row's own (DeepSeek V4: long enough for its ratio-128 compressor), else 32."""
  return tiny_models.TINY_MODELS[name].seq_len or 32


def load_hf(model_dir: str) -> dict[str, np.ndarray]:
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

  return load_file(os.path.join(model_dir, "model.safetensors"))


def copy_model(model_dir: str, tensors: dict[str, np.ndarray], replace_config: dict | None = None,
               **config_changes) -> str:
  """A new checkpoint directory with `tensors` and `model_dir`'s config.json changed."""
  from tools.safetensors_writer import write_safetensors  # pylint: disable=g-import-not-at-top

  with open(os.path.join(model_dir, "config.json")) as f:
    config = json.load(f)
  config = dict(replace_config or config, **config_changes)
  path = harness.scratch_dir("variant-")
  write_safetensors(os.path.join(path, "model.safetensors"), tensors)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  return path


def convert(model_dir: str, *flags: str) -> str:
  """The converter binary's float32 conversion (harness.converted: once per setting in this process, so the
  family tests below read the matrix cell of the same setting; read-only)."""
  return harness.converted(model_dir, "--save_dtype=float32", *flags)


class FamiliesTest(parameterized.TestCase):

  @parameterized.named_parameters(*CELLS)
  def test_logits_match_transformers(self, model, family, target, devices, scan):
    model_dir, reference = tiny_model(model)
    items = convert(model_dir, f"--simulated_cpu_devices_count={devices}", f"--scan_layers={scan}",
                    *tiny_models.TINY_MODELS[model].converter_flags)
    record = ConversionRecord.read(items)
    self.assertEqual((record.family, record.target_model), (family, target))
    report = validate_lib.validate(model_dir, items, reference=reference, seq_len=_seq_len(model))
    atol = tiny_models.TINY_MODELS[model].logits_atol
    thresholds = dataclasses.replace(THRESHOLDS, max_abs_diff=atol) if atol else THRESHOLDS
    self.assertEqual(report.failures(thresholds), [], report)

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
    overrides = ConversionRecord.read(items).maxtext_overrides
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

  def _tree(self, model: str, *flags: str):
    model_dir, _ = tiny_model(model)
    items = convert(model_dir, "--simulated_cpu_devices_count=1", *flags)
    return checkpoint_io.restore_v0(items)["params"]["params"]["decoder"], load_hf(model_dir), items

  def test_deepseek_groups_and_gate_bias(self):
    # 1 dense + 2 MoE layers. Scanned: dense_layers / moe_layers, the gate bias with the layer axis first (as
    # MaxText's MoEBiasVar); unscanned: dense_layers_0, moe_layers_0 and moe_layers_1 (numbered from 0).
    decoder, hf, _ = self._tree("deepseek3")
    bias = decoder["moe_layers"]["DeepSeekMoeBlock_0"]["MoeBlock_0"]["gate"]["bias"]
    self.assertEqual(bias.shape, (2, 8))
    np.testing.assert_array_equal(bias[1], hf["model.layers.2.mlp.gate.e_score_correction_bias"])
    wo = decoder["moe_layers"]["DeepSeekMoeBlock_0"]["MoeBlock_0"]["wo"]
    self.assertEqual(wo.shape, (8, 2, 48, 192))
    np.testing.assert_array_equal(wo[5, 0], hf["model.layers.1.mlp.experts.5.down_proj.weight"].T)
    self.assertEqual(decoder["dense_layers"]["mlp"]["wi_0"]["kernel"].shape, (192, 1, 256))
    decoder, hf, _ = self._tree("deepseek3", "--scan_layers=false")
    self.assertEqual(sorted(k for k in decoder if "layers" in k), ["dense_layers_0", "moe_layers_0", "moe_layers_1"])
    np.testing.assert_array_equal(decoder["moe_layers_1"]["DeepSeekMoeBlock_0"]["MoeBlock_0"]["gate"]["bias"],
                                  hf["model.layers.2.mlp.gate.e_score_correction_bias"])

  def test_deepseek_multi_token_prediction_layer_is_skipped(self):
    model_dir, reference = tiny_model("deepseek3")
    hf = load_hf(model_dir)
    with_mtp = {**hf, **{n.replace("layers.1.", "layers.3."): v for n, v in hf.items() if ".layers.1." in n},
                "model.layers.3.eh_proj.weight": np.zeros((192, 384), np.float32)}
    path = copy_model(model_dir, with_mtp, num_nextn_predict_layers=1)
    out = harness.scratch_dir("mt-")
    result = harness.run_converter(f"--hf_model_path={path}", f"--output_dir={out}", "--save_dtype=float32",
                                   "--simulated_cpu_devices_count=1")
    self.assertIn("multi-token-prediction", result.stdout)
    report = validate_lib.validate(model_dir, os.path.join(out, "0", "items"), reference=reference)
    self.assertEqual(report.failures(THRESHOLDS), [], report)
    # Without num_nextn_predict_layers the extra layer is not the model's: refused, not silently dropped.
    result = harness.run_converter(f"--hf_model_path={copy_model(model_dir, with_mtp, num_nextn_predict_layers=0)}",
                                   f"--output_dir={harness.scratch_dir('mt-')}", check=False)
    self.assertEqual(result.returncode, 1)
    self.assertIn("model.layers.3.", result.stderr)

  def test_deepseek_v3_checkpoint_needs_a_deepseek3_name(self):
    model_dir, _ = tiny_model("deepseek3")
    result = harness.run_converter(f"--hf_model_path={model_dir}", f"--output_dir={harness.scratch_dir('mt-')}",
                                   "--target_model=deepseek2-16b", check=False)
    self.assertEqual(result.returncode, 1)
    self.assertIn("deepseek3-*", result.stderr)

  def test_gpt_oss_gate_up_interleaved_in_strided_blocks(self):
    # Scanned in two blocks: layers_1 holds HF layers 1 and 3; gate = even columns, up = odd columns.
    decoder, hf, _ = self._tree("gpt_oss")
    mlp = decoder["layers"]["layers_1"]["GptOssMlp"]
    gate_up = hf["model.layers.3.mlp.experts.gate_up_proj"]
    np.testing.assert_array_equal(mlp["wi_0"][:, 1], gate_up[..., 0::2])
    np.testing.assert_array_equal(mlp["wi_1"][:, 1], gate_up[..., 1::2])
    np.testing.assert_array_equal(mlp["wi_1_bias"][:, 1], hf["model.layers.3.mlp.experts.gate_up_proj_bias"][:, 1::2])
    np.testing.assert_array_equal(decoder["layers"]["layers_1"]["GptOssAttention"]["sinks"][:, 1],
                                  hf["model.layers.3.self_attn.sinks"])

  def test_llama4_gate_up_halves_in_strided_blocks(self):
    # Scanned in four blocks: HF layer 6 is block 2, slot 1; gate = first half of gate_up, up = second half.
    decoder, hf, _ = self._tree("llama4_128e")
    block = decoder["layers"]["layers_1"]["Llama4MoEBlock_0"]
    gate_up = hf["model.layers.5.feed_forward.experts.gate_up_proj"]
    np.testing.assert_array_equal(block["MoeBlock_0"]["wi_0"][:, 1], gate_up[..., :64])
    np.testing.assert_array_equal(block["MoeBlock_0"]["wi_1"][:, 1], gate_up[..., 64:])
    self.assertNotIn("Llama4MoEBlock_0", decoder["layers"]["layers_2"])  # Even HF layers are dense.
    np.testing.assert_array_equal(decoder["layers"]["layers_2"]["mlp"]["wo"]["kernel"][:, 1],
                                  hf["model.layers.6.feed_forward.down_proj.weight"].T)

  def test_llama4_conditional_generation_converts_its_text_weights(self):
    # --text_only: the hub's multimodal wrapper's text weights alone, the tower and projector skipped saying why.
    model_dir, reference = tiny_model("llama4_16e")
    hf = load_hf(model_dir)
    wrapped = {f"language_model.{n}": v for n, v in hf.items()}
    wrapped["vision_model.patch_embedding.linear.weight"] = np.zeros((8, 8), np.float32)
    wrapped["multi_modal_projector.linear_1.weight"] = np.zeros((8, 8), np.float32)
    with open(os.path.join(model_dir, "config.json")) as f:
      text_config = json.load(f)
    path = copy_model(model_dir, wrapped, replace_config={
        "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "text_config": text_config,
        "vision_config": tiny_models.config_json("llama4_mm")["vision_config"]})
    out = harness.scratch_dir("mt-")
    result = harness.run_converter(f"--hf_model_path={path}", f"--output_dir={out}", "--save_dtype=float32",
                                   "--simulated_cpu_devices_count=1", "--text_only")
    self.assertLen([line for line in result.stdout.splitlines() if "(--text_only)" in line], 2, result.stdout)
    _, _, direct = self._tree("llama4_16e", "--save_dtype=float32")
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(os.path.join(out, "0", "items")),
                                                       checkpoint_io.restore_v0(direct)), [])

  def test_qwen3_next_scanned_blocks_then_layers(self):
    # 8 layers in cycles of 4: local_layers stacks (block, layer in block) after the feature axis, global_layer the
    # blocks' full-attention layers (3 and 7).
    decoder, hf, _ = self._tree("qwen3_next")
    local = decoder["layers"]["local_layers"]["attention"]
    self.assertEqual(local["in_proj_qkvz"]["kernel"].shape, (128, 2, 3, 256))
    np.testing.assert_array_equal(local["in_proj_qkvz"]["kernel"][:, 1, 2],
                                  hf["model.layers.6.linear_attn.in_proj_qkvz.weight"].T)
    np.testing.assert_array_equal(local["A_log"][:, 1, 0], hf["model.layers.4.linear_attn.A_log"])
    np.testing.assert_array_equal(local["conv1d"]["kernel"][:, 0, 1],
                                  hf["model.layers.1.linear_attn.conv1d.weight"].transpose(2, 1, 0))
    attention = decoder["layers"]["global_layer"]["attention"]["attention"]
    np.testing.assert_array_equal(attention["out"]["kernel"][:, 1], hf["model.layers.7.self_attn.o_proj.weight"].T)
    # The query kernel holds each head's query then its output gate.
    np.testing.assert_array_equal(attention["query"]["kernel"][:, 0],
                                  hf["model.layers.3.self_attn.q_proj.weight"].T.reshape(128, 4, 96))

  def test_qwen3_5_linear_projections_regrouped_per_key_head(self):
    # HF: in_proj_qkv = [q of every key head | k | v], in_proj_z, in_proj_b, in_proj_a apart. MaxText: [q, k, v, z]
    # and [b, a] for each of the 2 key heads (2 value heads each). Scanned, layer_1 holds HF layers 1 and 5.
    decoder, hf, _ = self._tree("qwen3_5")
    attention = decoder["layers"]["layer_1"]["attention"]
    E, Hk, Dk, Dv, r = 128, 2, 16, 24, 2
    a = "model.layers.5.linear_attn"
    qkv, z = hf[f"{a}.in_proj_qkv.weight"].T, hf[f"{a}.in_proj_z.weight"].T
    per_key_head = [qkv[:, :Hk * Dk], qkv[:, Hk * Dk:2 * Hk * Dk], qkv[:, 2 * Hk * Dk:], z]
    qkvz = np.concatenate([x.reshape(E, Hk, -1) for x in per_key_head], axis=-1).reshape(E, -1)
    self.assertEqual(qkvz.shape, (E, Hk * (2 * Dk + 2 * r * Dv)))
    np.testing.assert_array_equal(attention["in_proj_qkvz"]["kernel"][:, 1], qkvz)
    ba = np.concatenate([hf[f"{a}.in_proj_{x}.weight"].T.reshape(E, Hk, r) for x in "ba"], axis=-1).reshape(E, -1)
    np.testing.assert_array_equal(attention["in_proj_ba"]["kernel"][:, 1], ba)

  def test_qwen3_5_fused_experts_convert_as_per_expert(self):
    # The hub repos fuse each layer's experts (gate_up_proj, the gate's rows first; down_proj); transformers 5.24
    # saves them one by one: the same model either way.
    model_dir, reference = tiny_model("qwen3_5")
    path = quantize.fuse_experts(model_dir, harness.scratch_dir("fused-"))
    self.assertEqual(load_hf(path)["model.layers.3.mlp.experts.gate_up_proj"].shape, (4, 128, 128))
    for scan in (True, False):
      per_expert = checkpoint_io.restore_v0(self._tree("qwen3_5", f"--scan_layers={scan}")[2])
      items = convert(path, "--simulated_cpu_devices_count=1", f"--scan_layers={scan}")
      self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(items), per_expert), [])
    report = validate_lib.validate(model_dir, items, reference=reference)
    self.assertEqual(report.failures(THRESHOLDS), [], report)

  def test_qwen3_5_conditional_generation_converts_its_text_weights(self):
    # The hub's multimodal wrapper: text weights under model.language_model, the vision tower under model.visual,
    # the multi-token-prediction module under mtp; the text config nested. The tower converts by default (the
    # qwen3_5_mm row), so this stand-in's one tower tensor is refused; --text_only converts the text alone.
    model_dir, _ = tiny_model("qwen3_5")
    hf = load_hf(model_dir)
    wrapped = {n.replace("model.", "model.language_model.", 1): v for n, v in hf.items()}
    wrapped["model.visual.patch_embed.proj.weight"] = np.zeros((8, 8), np.float32)
    wrapped["mtp.fc.weight"] = np.zeros((8, 8), np.float32)
    with open(os.path.join(model_dir, "config.json")) as f:
      text_config = json.load(f)
    path = copy_model(model_dir, wrapped, replace_config={
        "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
        "text_config": dict(text_config, model_type="qwen3_5_moe_text"),
        "vision_config": dict(tiny_models.config_json("qwen3_5_mm")["vision_config"], out_hidden_size=128),
        "tie_word_embeddings": False})
    out = harness.scratch_dir("mt-")
    harness.assert_refused(self, path, "'model.visual.patch_embed.proj.weight' has shape (8, 8)")
    result = harness.run_converter(f"--hf_model_path={path}", f"--output_dir={out}", "--save_dtype=float32",
                                   "--simulated_cpu_devices_count=1", "--text_only")
    self.assertIn("vision tower and its patch mergers (--text_only)", result.stdout)
    self.assertIn("multi-token-prediction", result.stdout)
    _, _, direct = self._tree("qwen3_5")
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(os.path.join(out, "0", "items")),
                                                       checkpoint_io.restore_v0(direct)), [])

  def test_deepseek4_every_leaf_is_the_maps_value(self):
    model_dir, _ = tiny_model("deepseek4")
    hf = load_hf(model_dir)
    with open(os.path.join(model_dir, "config.json")) as f:
      config = json.load(f)
    self.assertEqual(hf["layers.0.ffn.gate.tid2eid"].dtype, np.int64)
    for scan, leaves in ((False, 310), (True, 220)):
      items = convert(model_dir, "--simulated_cpu_devices_count=1", f"--scan_layers={scan}")
      stored = checkpoint_io.flatten(checkpoint_io.restore_v0(items)["params"]["params"])
      expected = {"".join(f"[{k!r}]" for k in path): value
                  for path, value in deepseek4_expected_leaves(hf, config, scan).items()}
      self.assertLen(expected, leaves)
      self.assertEqual(sorted(stored), sorted(expected))
      for path, value in expected.items():
        self.assertEqual(stored[path].dtype, np.float32, path)
        np.testing.assert_array_equal(stored[path], value, err_msg=path)

  def test_deepseek4_saved_names_and_transformers_config_convert_alike(self):
    # transformers' save_pretrained writes its own names (the hub's under `model.`, but for four) and config keys.
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top

    model_dir, _ = tiny_model("deepseek4")
    saved = harness.scratch_dir("deepseek4-saved-")
    transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).save_pretrained(saved)
    names = load_hf(saved)
    self.assertIn("model.layers.3.attn.norm.weight", names)
    self.assertIn("model.hc_head.hc_fn", names)
    with open(os.path.join(saved, "config.json")) as f:
      self.assertIn("layer_types", json.load(f))
    hub = checkpoint_io.restore_v0(convert(model_dir, "--simulated_cpu_devices_count=1", "--scan_layers=true"))
    items = convert(saved, "--simulated_cpu_devices_count=1", "--scan_layers=true")
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(items), hub), [])

  def test_deepseek4_mtp_block_is_skipped(self):
    model_dir, _ = tiny_model("deepseek4")
    hf = load_hf(model_dir)
    with_mtp = {**hf, **{"mtp.0." + n[len("layers.6."):]: v for n, v in hf.items() if n.startswith("layers.6.")},
                "mtp.0.e_proj.weight": np.zeros((256, 256), np.float32)}
    with open(os.path.join(model_dir, "config.json")) as f:
      config = json.load(f)
    path = copy_model(model_dir, with_mtp, num_nextn_predict_layers=1,
                      compress_ratios=config["compress_ratios"] + [0])  # The hub lists the MTP block's ratio too.
    out = harness.scratch_dir("mt-")
    result = harness.run_converter(f"--hf_model_path={path}", f"--output_dir={out}", "--save_dtype=float32",
                                   "--simulated_cpu_devices_count=1", "--scan_layers=false")
    self.assertIn("multi-token-prediction", result.stdout)
    plain = checkpoint_io.restore_v0(convert(model_dir, "--simulated_cpu_devices_count=1", "--scan_layers=false"))
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(os.path.join(out, "0", "items")),
                                                       plain), [])

  def test_qwen3_vl_moe_hub_and_saved_expert_layouts_convert_alike(self):
    # transformers 5.24 writes the fused experts (X, 2M, E) / (X, E, M); the hub stores (X, E, 2M) / (X, M, E),
    # already (in, out). One name, two axis orders, told apart by shape: the same checkpoint either way.
    model_dir, _ = tiny_model("qwen3_vl_moe")
    hf = load_hf(model_dir)
    self.assertEqual(hf["model.language_model.layers.0.mlp.experts.gate_up_proj"].shape, (4, 96, 64))
    hub = {n: np.ascontiguousarray(np.swapaxes(v, 1, 2)) if ".mlp.experts." in n else v for n, v in hf.items()}
    saved = checkpoint_io.restore_v0(self._tree("qwen3_vl_moe", "--scan_layers=false")[2])
    items = convert(copy_model(model_dir, hub), "--simulated_cpu_devices_count=1", "--scan_layers=false")
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(items), saved), [])
    moe = saved["params"]["params"]["decoder"]["layers_3"]["moe_block"]
    gate_up = hf["model.language_model.layers.3.mlp.experts.gate_up_proj"]  # (X, 2M, E): the gate's rows first.
    np.testing.assert_array_equal(moe["wi_0"][2], gate_up[2, :48].T)
    np.testing.assert_array_equal(moe["wi_1"][2], gate_up[2, 48:].T)

  def test_qwen3_vl_scans_only_without_its_tower(self):
    # MaxText feeds deepstack features between unscanned decoder layers only; the text decoder alone scans.
    model_dir, _ = tiny_model("qwen3_vl")
    harness.assert_refused(self, model_dir, "--scan_layers=true", "deepstack", "--text_only",
                           flags=("--scan_layers=true",))
    items = convert(model_dir, "--simulated_cpu_devices_count=1", "--scan_layers=true", "--text_only")
    self.assertNotIn("vision_encoder", checkpoint_io.restore_v0(items)["params"]["params"])
    overrides = ConversionRecord.read(items).maxtext_overrides
    self.assertEqual((overrides["use_multimodal"], overrides["deepstack_visual_indexes_for_vit"]), (False, []))

  def test_olmo3_global_query_key_norms(self):
    # OLMo 3 normalises q and k over all heads at once: one (H * D,) scale, stored flat.
    decoder, hf, _ = self._tree("olmo3", "--scan_layers=false")
    attention = decoder["layers_2"]["attention"]
    np.testing.assert_array_equal(attention["query_norm"]["scale"], hf["model.layers.2.self_attn.q_norm.weight"])
    self.assertEqual(attention["key_norm"]["scale"].shape, hf["model.layers.2.self_attn.k_norm.weight"].shape)
    self.assertNotIn("pre_self_attention_layer_norm", decoder["layers_2"])

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

  # --- Gemma 4 ------------------------------------------------------------------------------------------------------

  def test_gemma4_scanned_blocks_and_fused_experts(self):
    # 12 layers = 2 blocks of 5 sliding + 1 global: local_layers stacks (block, layer in block) after the experts
    # axis, so HF layer 8 is [:, 1, 2]; gate_up_proj (X, 2M, E) holds the gate in its first M rows.
    decoder, hf, items = self._tree("gemma4_moe")
    local, global_layer = decoder["scanned_blocks"]["local_layers"], decoder["scanned_blocks"]["global_layer"]
    experts = local["mlp"]["moe_block"]["MoeBlock_0"]
    self.assertEqual(experts["wi_0"].shape, (8, 2, 5, 256, 64))
    gate_up = hf["model.layers.8.experts.gate_up_proj"]
    np.testing.assert_array_equal(experts["wi_0"][:, 1, 2], gate_up[:, :64].transpose(0, 2, 1))
    np.testing.assert_array_equal(experts["wi_1"][:, 1, 2], gate_up[:, 64:].transpose(0, 2, 1))
    np.testing.assert_array_equal(experts["wo"][:, 1, 2], hf["model.layers.8.experts.down_proj"].transpose(0, 2, 1))
    np.testing.assert_array_equal(experts["per_expert_scale"][:, 1, 2], hf["model.layers.8.router.per_expert_scale"])
    np.testing.assert_array_equal(local["layer_scalar"][:, 0, 3], hf["model.layers.3.layer_scalar"])
    # Global layers (5 and 11): the router's input scale, norms as they are (no + 1), one KV head of 96 whose
    # values are its keys (attention_k_eq_v: no value kernel).
    np.testing.assert_array_equal(global_layer["mlp"]["pre_forward_scale_2"][:, 1], hf["model.layers.11.router.scale"])
    np.testing.assert_array_equal(global_layer["mlp"]["post_feedforward_layernorm_1"]["scale"][:, 0],
                                  hf["model.layers.5.post_feedforward_layernorm_1.weight"])
    self.assertEqual(global_layer["self_attention"]["key"]["kernel"].shape, (256, 2, 1, 96))
    self.assertNotIn("value", global_layer["self_attention"])
    self.assertIn("value", local["self_attention"])
    self.assertNotIn("layers_remainder", decoder)
    embedding = checkpoint_io.restore_v0(items)["params"]["params"]["token_embedder"]["embedding"]
    np.testing.assert_array_equal(embedding, hf["model.embed_tokens.weight"] * np.float32(16))  # sqrt(E), exact.

  def test_gemma4_kv_shared_layers_and_per_layer_inputs(self):
    # E2B-like, 10 layers: 6-9 reuse earlier keys and values (no k/v kernels, no key norm) and have MLPs twice as
    # wide; the per-layer table is stored unscaled.
    decoder, hf, _ = self._tree("gemma4_e2b", "--scan_layers=false")
    for i in range(10):
      shared = i >= 6
      attention = decoder[f"layers_{i}"]["self_attention"]
      self.assertEqual({"key", "value", "key_norm"} & set(attention), set() if shared else {"key", "value", "key_norm"})
      self.assertEqual(decoder[f"layers_{i}"]["mlp"]["wi_0"]["kernel"].shape, (256, 256 if shared else 128))
    np.testing.assert_array_equal(decoder["per_layer_embedder"]["embed_tokens_per_layer"],
                                  hf["model.embed_tokens_per_layer.weight"])
    np.testing.assert_array_equal(decoder["layers_9"]["per_layer_input_gate"]["kernel"],
                                  hf["model.layers.9.per_layer_input_gate.weight"].T)

  def test_gemma4_small_refuses_scan_layers_at_once(self):
    model_dir, _ = tiny_model("gemma4_e2b")
    out = harness.scratch_dir("mt-")
    result = harness.run_converter(f"--hf_model_path={model_dir}", f"--output_dir={out}", "--scan_layers=true",
                                   check=False)
    self.assertEqual(result.returncode, 1)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    self.assertLen(errors, 1, result.stderr)
    self.assertIn("no scanned form of gemma4-e2b", errors[0])
    self.assertIn("--noscan_layers", errors[0])
    self.assertFalse(os.path.exists(os.path.join(out, "0")))

  def test_gemma4_kv_tensors_of_shared_layers_are_skipped(self):
    # Hub E2B/E4B checkpoints keep k/v projections and norms for the KV-shared layers; transformers drops them.
    model_dir, _ = tiny_model("gemma4_e4b")
    hf = load_hf(model_dir)
    extra = dict(hf)
    for layer, donor in ((8, 7), (11, 5)):
      for name in ("k_proj", "v_proj", "k_norm"):
        extra[f"model.layers.{layer}.self_attn.{name}.weight"] = hf[f"model.layers.{donor}.self_attn.{name}.weight"]
    out = harness.scratch_dir("mt-")
    result = harness.run_converter(f"--hf_model_path={copy_model(model_dir, extra)}", f"--output_dir={out}",
                                   "--save_dtype=float32", "--simulated_cpu_devices_count=1", "--scan_layers=false")
    self.assertLen([line for line in result.stdout.splitlines() if "KV-shared layers" in line], 1, result.stdout)
    _, _, direct = self._tree("gemma4_e4b", "--scan_layers=false")
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(os.path.join(out, "0", "items")),
                                                       checkpoint_io.restore_v0(direct)), [])

  def test_gemma4_conditional_generation_converts_its_text_weights(self):
    # The hub's multimodal checkpoint with --text_only: text weights under model.language_model, towers and
    # embedders beside them (the vision ones skipped for --text_only, the audio ones always: MaxText has no Gemma 4
    # audio encoder), and a hub-style text config (global layers' sizes as global_head_dim /
    # num_global_key_value_heads).
    model_dir, _ = tiny_model("gemma4_moe")
    hf = load_hf(model_dir)
    wrapped = {n.replace("model.", "model.language_model.", 1): v for n, v in hf.items()}
    for module in ("vision_tower.encoder.layers.0.mlp.gate_proj.linear", "embed_vision.embedding_projection",
                   "audio_tower.layers.0.feed_forward1.ffw_layer_1.linear", "embed_audio.embedding_projection"):
      wrapped[f"model.{module}.weight"] = np.zeros((8, 8), np.float32)
    with open(os.path.join(model_dir, "config.json")) as f:
      text_config = json.load(f)
    del text_config["per_layer_config"]
    text_config.update(global_head_dim=96, num_global_key_value_heads=1)
    path = copy_model(model_dir, wrapped, replace_config={
        "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": text_config,
        "vision_config": tiny_models.config_json("gemma4_mm")["vision_config"],
        "audio_config": {"model_type": "gemma4_audio"}})
    out = harness.scratch_dir("mt-")
    result = harness.run_converter(f"--hf_model_path={path}", f"--output_dir={out}", "--save_dtype=float32",
                                   "--simulated_cpu_devices_count=1", "--text_only")
    lines = result.stdout.splitlines()
    self.assertLen([line for line in lines if "skipped 2 tensor(s)" in line and "no Gemma 4 audio encoder" in line], 1,
                   result.stdout)
    self.assertLen([line for line in lines if "skipped 1 tensor(s)" in line and "(--text_only)" in line], 2,
                   result.stdout)
    _, _, direct = self._tree("gemma4_moe")
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(os.path.join(out, "0", "items")),
                                                       checkpoint_io.restore_v0(direct)), [])


def deepseek4_expected_leaves(hf: dict[str, np.ndarray], config: dict, scan: bool) -> dict[tuple[str, ...], np.ndarray]:
  """Every leaf of a DeepSeek V4 conversion, made from the hub tensors by the contract's map
  (maxtext-contract-deepseek4-lora.md), in numpy and independently of converter/families/deepseek4.py."""
  E, H, D, N = config["hidden_size"], config["num_attention_heads"], config["head_dim"], config["hc_mult"]
  G, o_lora, q_lora, K = config["o_groups"], config["o_lora_rank"], config["q_lora_rank"], config["num_hash_layers"]
  ratios = config["compress_ratios"]

  def layer(i: int) -> dict[str, np.ndarray]:
    t = lambda name: hf[f"layers.{i}.{name}"]  # pylint: disable=unnecessary-lambda-assignment
    out = {"pre_self_attention_layer_norm/scale": t("attn_norm.weight"),
           "post_self_attention_layer_norm/scale": t("ffn_norm.weight")}
    for mixer, name in (("mhc_attention", "hc_attn"), ("mhc_mlp", "hc_ffn")):
      fn, base, scale = t(f"{name}_fn"), t(f"{name}_base"), t(f"{name}_scale")
      out.update({f"{mixer}/mhc_norm/scale": np.ones(N * E, np.float32),
                  f"{mixer}/pre_alpha": fn[:N].T, f"{mixer}/post_alpha": fn[N:2 * N].T, f"{mixer}/res_alpha": fn[2 * N:].T,
                  f"{mixer}/pre_beta": base[:N], f"{mixer}/post_beta": base[N:2 * N],
                  f"{mixer}/res_beta": base[2 * N:].reshape(N, N), f"{mixer}/pre_alpha_scale": scale[0:1],
                  f"{mixer}/post_alpha_scale": scale[1:2], f"{mixer}/res_alpha_scale": scale[2:3]})
    a = "self_attention"
    out.update({f"{a}/wq_a/kernel": t("attn.wq_a.weight").T, f"{a}/q_norm/scale": t("attn.q_norm.weight"),
                f"{a}/wq_b/kernel": t("attn.wq_b.weight").T.reshape(q_lora, H, D),
                f"{a}/wkv/kernel": t("attn.wkv.weight").T.reshape(E, 1, D), f"{a}/kv_norm/scale": t("attn.kv_norm.weight"),
                f"{a}/sinks": t("attn.attn_sink"),
                f"{a}/o_a_proj/kernel": t("attn.wo_a.weight").reshape(G, o_lora, H * D // G).transpose(0, 2, 1),
                f"{a}/o_b_proj/kernel": t("attn.wo_b.weight").T})
    compressors = {4: (("csa_compressor", "attn.compressor"), ("csa_compressor/indexer", "attn.indexer.compressor")),
                   128: (("hca_compressor", "attn.compressor"),), 0: ()}[ratios[i]]
    for leaf, name in compressors:
      out.update({f"{a}/{leaf}/kv_proj/kernel": t(f"{name}.wkv.weight").T,
                  f"{a}/{leaf}/gate_proj/kernel": t(f"{name}.wgate.weight").T,
                  f"{a}/{leaf}/kv_norm/scale": t(f"{name}.norm.weight"), f"{a}/{leaf}/position_bias": t(f"{name}.ape")})
    if ratios[i] == 4:
      out.update({f"{a}/csa_compressor/indexer/q_proj/kernel": t("attn.indexer.wq_b.weight").T,
                  f"{a}/csa_compressor/indexer/weights_proj/kernel": t("attn.indexer.weights_proj.weight").T})
    experts = range(config["n_routed_experts"])
    out.update({"mlp/MoeBlock_0/gate/kernel": t("ffn.gate.weight").T,
                "mlp/MoeBlock_0/wi_0": np.stack([t(f"ffn.experts.{e}.w1.weight").T for e in experts]),
                "mlp/MoeBlock_0/wi_1": np.stack([t(f"ffn.experts.{e}.w3.weight").T for e in experts]),
                "mlp/MoeBlock_0/wo": np.stack([t(f"ffn.experts.{e}.w2.weight").T for e in experts]),
                "mlp/shared_experts/wi_0/kernel": t("ffn.shared_experts.w1.weight").T,
                "mlp/shared_experts/wi_1/kernel": t("ffn.shared_experts.w3.weight").T,
                "mlp/shared_experts/wo/kernel": t("ffn.shared_experts.w2.weight").T})
    if i < K:
      out["mlp/MoeBlock_0/tid2eid"] = t("ffn.gate.tid2eid").astype(np.float32)
    else:
      out["mlp/MoeBlock_0/gate/bias"] = t("ffn.gate.bias")
    return out

  leaves = {("token_embedder", "embedding"): hf["embed.weight"], ("decoder", "decoder_norm", "scale"): hf["norm.weight"],
            ("decoder", "logits_dense", "kernel"): hf["head.weight"].T,
            ("decoder", "hc_head", "hc_fn"): hf["hc_head_fn"].T, ("decoder", "hc_head", "hc_base"): hf["hc_head_base"],
            ("decoder", "hc_head", "hc_scale"): hf["hc_head_scale"]}
  unrolled = K if scan else len(ratios)
  for i in range(unrolled):
    leaves.update({("decoder", f"layers_{i}", *k.split("/")): v for k, v in layer(i).items()})
  if scan:  # Pairs (128, 4) after the hash layers, stacked on axis 1; the gate bias on axis 0.
    for j in range(2):
      per_layer = [layer(i) for i in range(K + j, len(ratios), 2)]
      for k in per_layer[0]:
        axis = 0 if k.endswith("gate/bias") else 1
        leaves[("decoder", "scanned_blocks", f"layers_{j}", *k.split("/"))] = np.stack([p[k] for p in per_layer], axis)
  return leaves


# The cases that share a tiny model run in one shard (each model built once): the matrix cells by the model in
# their name, the family tests by the model they read.
SHARD_GROUPS = harness.model_group(
    r"test_logits_match_transformers_(.+?)_devices\d+_",
    {"test_wrong_target_is_caught_by_validator": "llama3_1", "test_llama31_kernels_are_permuted_and_scaled": "llama3_1",
     "test_scanned_experts_are_experts_first_then_layers": "qwen3_moe", "test_vocab_padding": "llama3_2_tied",
     "test_tie_word_embeddings_contradicting_tensors_is_refused_tied_flag_with_lm_head": "llama3",
     "test_tie_word_embeddings_contradicting_tensors_is_refused_untied_flag_without_lm_head": "llama3_2_tied",
     "test_deepseek_groups_and_gate_bias": "deepseek3", "test_deepseek_multi_token_prediction_layer_is_skipped":
     "deepseek3", "test_deepseek_v3_checkpoint_needs_a_deepseek3_name": "deepseek3",
     "test_gpt_oss_gate_up_interleaved_in_strided_blocks": "gpt_oss",
     "test_llama4_gate_up_halves_in_strided_blocks": "llama4_128e",
     "test_llama4_conditional_generation_converts_its_text_weights": "llama4_16e",
     "test_qwen3_next_scanned_blocks_then_layers": "qwen3_next",
     "test_qwen3_5_linear_projections_regrouped_per_key_head": "qwen3_5",
     "test_qwen3_5_fused_experts_convert_as_per_expert": "qwen3_5",
     "test_qwen3_5_conditional_generation_converts_its_text_weights": "qwen3_5",
     "test_qwen3_vl_moe_hub_and_saved_expert_layouts_convert_alike": "qwen3_vl_moe",
     "test_qwen3_vl_scans_only_without_its_tower": "qwen3_vl",
     "test_olmo3_global_query_key_norms": "olmo3", "test_unsupported_architecture_lists_supported_ones": "qwen3",
     "test_gemma4_scanned_blocks_and_fused_experts": "gemma4_moe",
     "test_gemma4_kv_shared_layers_and_per_layer_inputs": "gemma4_e2b",
     "test_gemma4_small_refuses_scan_layers_at_once": "gemma4_e2b",
     "test_gemma4_kv_tensors_of_shared_layers_are_skipped": "gemma4_e4b",
     "test_gemma4_conditional_generation_converts_its_text_weights": "gemma4_moe",
     "test_deepseek4_every_leaf_is_the_maps_value": "deepseek4",
     "test_deepseek4_saved_names_and_transformers_config_convert_alike": "deepseek4",
     "test_deepseek4_mtp_block_is_skipped": "deepseek4"})

if __name__ == "__main__":
  absltest.main(testLoader=harness.GroupShardingLoader(SHARD_GROUPS))
