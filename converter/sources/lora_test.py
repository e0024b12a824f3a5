"""LoRA adapters merged while reading: every region equals the float32 merge `W + s * B @ A` of the whole weight
(rank and alpha patterns, rsLoRA, bf16 bases, FP8 bases dequantized first, aliased names), and every adapter a
merge cannot reproduce is refused naming the file, the module and the reason."""

import json
import math
import os
import tempfile
from unittest import mock

import ml_dtypes
import numpy as np
from absl.testing import absltest, parameterized

from converter.errors import ConversionError
from converter.sources import fp8, lora, open_safetensors
from tools import quantize
from tools.safetensors_writer import write_safetensors

OUT, IN = 40, 24  # Unequal: a transposed factor cannot pass.
BASE_CONFIG = {"peft_type": "LORA", "r": 4, "lora_alpha": 12, "target_modules": ["q_proj", "o_proj"],
               "bias": "none", "use_dora": False, "modules_to_save": None, "fan_in_fan_out": False}


def _scratch() -> str:
  return tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))


def _write_adapter(tensors: dict, **config) -> str:
  directory = _scratch()
  write_safetensors(os.path.join(directory, lora.ADAPTER_WEIGHTS), tensors)
  with open(os.path.join(directory, lora.ADAPTER_CONFIG), "w") as f:
    json.dump({**BASE_CONFIG, **config}, f)
  return directory


def _factors(rng, module: str, rank: int, out: int = OUT, inputs: int = IN) -> dict:
  return {f"{lora.PREFIX}{module}{lora.LORA_A}": rng.standard_normal((rank, inputs)).astype(np.float32),
          f"{lora.PREFIX}{module}{lora.LORA_B}": rng.standard_normal((out, rank)).astype(np.float32)}


class PatternKeyTest(parameterized.TestCase):
  """peft 0.21.2's get_pattern_key: `re.match(rf"(.*\\.)?({key})$", module)`, first key wins."""

  @parameterized.parameters(
      (["q_proj"], "model.layers.0.self_attn.q_proj", "q_proj"),
      (["proj"], "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.q_proj"),  # Not at a `.` boundary.
      (["layers.1.mlp.down_proj"], "model.layers.1.mlp.down_proj", "layers.1.mlp.down_proj"),
      (["layers.1.mlp.down_proj"], "model.layers.11.mlp.down_proj", "model.layers.11.mlp.down_proj"),
      ([r"layers\.[01]\..*q_proj"], "model.layers.1.self_attn.q_proj", r"layers\.[01]\..*q_proj"),
      (["q_proj", "self_attn.q_proj"], "model.layers.0.self_attn.q_proj", "q_proj"),  # The first match.
  )
  def test_matches_peft(self, keys, module, expected):
    self.assertEqual(lora.get_pattern_key(keys, module), expected)


class MergeTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.rng = np.random.default_rng(0)
    self.weights = {f"model.layers.{i}.self_attn.{m}.weight": self.rng.standard_normal((OUT, IN)).astype(np.float32)
                    for i in range(2) for m in ("q_proj", "o_proj")}

  def _base(self, dtype=np.float32) -> str:
    directory = _scratch()
    write_safetensors(os.path.join(directory, "model.safetensors"),
                      {k: v.astype(dtype) for k, v in self.weights.items()})
    return directory

  def _expected(self, adapter_tensors: dict, module: str, scale: float, base=None) -> np.ndarray:
    """The merge in float64 (the float32 one agrees to a few ulp: its sums run in another order)."""
    a = adapter_tensors[f"{lora.PREFIX}{module}{lora.LORA_A}"].astype(np.float64)
    b = adapter_tensors[f"{lora.PREFIX}{module}{lora.LORA_B}"].astype(np.float64)
    w = self.weights[module + ".weight"] if base is None else base
    return w.astype(np.float64) + (b @ a) * scale

  def assert_merged(self, actual: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=2e-6)

  def test_patterns_and_rslora_scale_each_module(self):
    tensors = {}
    ranks = {"model.layers.0.self_attn.q_proj": 8, "model.layers.0.self_attn.o_proj": 4,
             "model.layers.1.self_attn.q_proj": 2, "model.layers.1.self_attn.o_proj": 4}
    for module, rank in ranks.items():
      tensors.update(_factors(self.rng, module, rank))
    config = dict(rank_pattern={r"layers.0.self_attn.q_proj": 8, r"layers\.1\..*q_proj": 2},
                  alpha_pattern={"o_proj": 5})
    for rslora in (False, True):
      adapter = lora.read_adapter(_write_adapter(tensors, use_rslora=rslora, **config))
      source = lora.merged_source(open_safetensors(self._base()), adapter)
      for module, rank in ranks.items():
        alpha = 5 if module.endswith("o_proj") else 12
        scale = alpha / (math.sqrt(rank) if rslora else rank)
        with self.subTest(module=module, rslora=rslora):
          self.assertEqual({m.module: m.scale for m in adapter.modules}[module], scale)
          self.assert_merged(source.tensors[module + ".weight"].read(np.float32),
                             self._expected(tensors, module, scale))

  @parameterized.parameters(np.float32, ml_dtypes.bfloat16)
  def test_regions_and_transposes_equal_the_whole(self, dtype):
    module = "model.layers.1.self_attn.q_proj"
    tensors = _factors(self.rng, module, 4)
    adapter = lora.read_adapter(_write_adapter(tensors))
    base = self._base(np.float32 if dtype == np.float32 else ml_dtypes.bfloat16)
    tensor = lora.merged_source(open_safetensors(base), adapter).tensors[module + ".weight"]
    merged = tensor.read(np.float32)
    self.assert_merged(merged, self._expected(tensors, module, 3.0, self.weights[module + ".weight"].astype(dtype)))
    whole = tensor.read(dtype)
    np.testing.assert_array_equal(whole, merged.astype(dtype))  # Rounded once, from the float32 sum.
    # Slabs of a few rows (not the default's whole region here): the same values, however a read is cut.
    with mock.patch.object(lora, "SLAB_VALUES", 50):
      for region in [(slice(3, 17),), (5,), (slice(0, OUT), slice(7, 20)), (slice(30, 40), 2)]:
        with self.subTest(region=region):
          np.testing.assert_array_equal(tensor.read(dtype, region), whole[region])
      np.testing.assert_array_equal(tensor.read(dtype, (slice(3, 17),), transpose=True), whole[3:17].T)
    self.assertEqual(tensor.format, f"{'F32' if dtype == np.float32 else 'BF16'} + LoRA r4")
    self.assertIn(os.path.join(adapter.location, lora.ADAPTER_WEIGHTS), tensor.files)

  def test_fp8_base_is_dequantized_before_the_merge(self):
    module = "model.layers.0.self_attn.o_proj"
    weight = self.weights[module + ".weight"]
    values, scales = quantize.fp8_block_quantize(weight, (16, 16))
    directory = _scratch()
    write_safetensors(os.path.join(directory, "model.safetensors"),
                      {module + ".weight": values, module + ".weight_scale_inv": scales})
    plain = fp8.fp8_source(open_safetensors(directory), {"quant_method": "fp8", "weight_block_size": [16, 16]}, "c")
    tensors = _factors(self.rng, module, 4)
    source = lora.merged_source(plain, lora.read_adapter(_write_adapter(tensors)))
    dequantized = quantize.fp8_dequantize(values, scales, (16, 16))
    self.assert_merged(source.tensors[module + ".weight"].read(np.float32),
                       self._expected(tensors, module, 3.0, dequantized))

  def test_adapter_names_match_through_the_aliases(self):
    stored = {k.replace("model.", "model.language_model.", 1): v for k, v in self.weights.items()}
    directory = _scratch()
    write_safetensors(os.path.join(directory, "model.safetensors"), stored)
    module = "model.layers.0.self_attn.q_proj"
    adapter = lora.read_adapter(_write_adapter(_factors(self.rng, module, 4)))
    rename = lambda name: name.replace("model.language_model.", "model.", 1)
    source = lora.merged_source(open_safetensors(directory), adapter, rename)
    self.assertEqual(source.merged, {module: "model.language_model.layers.0.self_attn.q_proj.weight"})
    with self.assertRaisesRegex(ConversionError, "has no base weight"):
      lora.merged_source(open_safetensors(directory), adapter)


class RefusalTest(parameterized.TestCase):
  """Each refusal names the adapter file, the module (or setting) and why."""

  def setUp(self):
    super().setUp()
    self.rng = np.random.default_rng(1)
    self.module = "model.layers.0.self_attn.q_proj"
    self.good = _factors(self.rng, self.module, 4)

  @parameterized.named_parameters(
      ("dora", dict(use_dora=True), "use_dora", "magnitude"),
      ("modules_to_save", dict(modules_to_save=["lm_head"]), "modules_to_save", "replaces whole modules"),
      ("bias", dict(bias="lora_only"), "bias", "trains the base modules' biases"),
      ("fan_in_fan_out", dict(fan_in_fan_out=True), "fan_in_fan_out", "(in, out)"),
      ("not_lora", dict(peft_type="IA3"), "peft_type", "only LoRA adapters"),
      ("target_parameters", dict(target_parameters=["experts.gate_up_proj"]), "target_parameters", "fused MoE"),
      ("alora", dict(alora_invocation_tokens=[5]), "alora_invocation_tokens", "everywhere"),
      ("zero_rank", dict(r=0), "r is 0", "positive integer"),
  )
  def test_refused_settings(self, config, *expected):
    directory = _write_adapter(self.good, **config)
    with self.assertRaises(ConversionError) as raised:
      lora.read_adapter(directory)
    for text in (os.path.join(directory, lora.ADAPTER_CONFIG), *expected):
      self.assertIn(text, str(raised.exception))

  @parameterized.named_parameters(
      ("dora_vector", ".lora_magnitude_vector", (OUT,), "DoRA magnitude vector"),
      ("embedding", ".lora_embedding_A", (4, OUT), "embedding-layer LoRA"),
      ("saved_module", ".weight", (OUT, IN), "modules_to_save"),
      ("lora_bias", ".lora_B.bias", (OUT,), "lora bias"),
      ("saved_base_layer", ".base_layer.weight", (OUT, IN), "save_embedding_layers"),
  )
  def test_refused_tensors(self, suffix, shape, reason):
    name = f"{lora.PREFIX}model.layers.0.self_attn.k_proj{suffix}"
    directory = _write_adapter({**self.good, name: np.zeros(shape, np.float32)})
    with self.assertRaises(ConversionError) as raised:
      lora.read_adapter(directory)
    for text in (os.path.join(directory, lora.ADAPTER_WEIGHTS), name, "model.layers.0.self_attn.k_proj", reason):
      self.assertIn(text, str(raised.exception))

  def test_factor_shapes(self):
    a, b = (f"{lora.PREFIX}{self.module}{s}" for s in (lora.LORA_A, lora.LORA_B))
    cases = [({a: self.good[a], b: self.good[b][:, :3]}, "do not fit each other"),
             ({a: self.good[a]}, "no lora_B weight"),
             (_factors(self.rng, self.module, 6), "gives the module r = 4")]
    for tensors, reason in cases:
      with self.subTest(reason=reason):
        with self.assertRaisesRegex(ConversionError, f"{lora.ADAPTER_WEIGHTS}: .*{self.module}.*{reason}"):
          lora.read_adapter(_write_adapter(tensors))

  def test_base_mismatch(self):
    directory = _scratch()
    write_safetensors(os.path.join(directory, "model.safetensors"),
                      {f"{self.module}.weight": np.zeros((OUT, IN + 1), np.float32)})
    adapter = lora.read_adapter(_write_adapter(self.good))
    mismatch = rf"{self.module}.*\(40, 24\), but the base weight .* shape \(40, 25\)"
    with self.assertRaisesRegex(ConversionError, mismatch):
      lora.merged_source(open_safetensors(directory), adapter)
    other = lora.read_adapter(_write_adapter(_factors(self.rng, "model.layers.7.mlp.up_proj", 4)))
    with self.assertRaisesRegex(ConversionError, "module 'model.layers.7.mlp.up_proj' has no base weight"):
      lora.merged_source(open_safetensors(directory), other)


if __name__ == "__main__":
  absltest.main()
