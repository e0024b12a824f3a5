"""Quantizes an HF checkpoint the way DeepSeek (FP8 with block scales) and GPT-OSS (MXFP4) ship theirs, and
dequantizes one back, with plain numpy: test fixtures and the independent reference the converter's sources are
checked against (nothing here is shared with converter/sources/).

  FP8: every weight named by `fp8_weights` becomes F8_E4M3 plus `<name>_scale_inv` (F32, one multiplier per
  block of `block` values, the last block on an axis possibly partial); config.json gets
  quantization_config {quant_method: fp8, fmt: e4m3, weight_block_size: block}.
  MXFP4: every `*.mlp.experts.{gate_up,down}_proj` (HF's (experts, in, out)) becomes `<name>_blocks` (U8, two e2m1
  values per byte, low nibble first, stored (out, in / 32, 16)) plus `<name>_scales` (U8 exponents + 127);
  config.json gets quantization_config {quant_method: mxfp4}.
  DeepSeek V4 (hub names): the projections DeepSeek-V4-Flash ships in FP8 become F8_E4M3 plus `<module>.scale`
  (F8_E8M0 powers of two per block), its routed experts `ffn.experts.{e}.w{1,2,3}.weight` I8 (out, in / 2: two
  e2m1 values per byte, low nibble first) plus `.scale` (F8_E8M0 per 32 values of a row), or FP8 like the rest for
  -Base; config.json gets quantization_config {quant_method: fp8, fmt: e4m3, scale_fmt: ue8m0, weight_block_size}
  and the hub's top-level `expert_dtype`.
  compressed-tensors INT4 (Kimi K2-Thinking, K2.5, K2.6): every routed expert `*.mlp.experts.{e}.{gate,up,down}_proj`
  becomes `.weight_packed` / `.weight_scale` / `.weight_shape`, written by compressed-tensors' own compressor
  (`PackedQuantizationCompressor.compress`, which imports torch: this format alone is not plain numpy), and read
  back by its own decompressor; config.json (or its `text_config`) gets Kimi's quantization_config.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Callable, Mapping

import ml_dtypes
import numpy as np

from converter.sources import open_safetensors
from tools.safetensors_writer import write_safetensors

FP8_MAX = 448.0  # Largest finite float8_e4m3fn.
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                       np.float32)
# DeepSeek V3's FP8 checkpoints: every projection of attention, the indexer and the MLPs; not the router, norms,
# embeddings, lm_head or the indexer's weights_proj.
DEEPSEEK_FP8_WEIGHTS = re.compile(r".*\.(self_attn|mlp)\..*_proj(_with_mqa)?\.weight$|.*\.indexer\.(wq_b|wk)\.weight$")
DEEPSEEK_FP8_EXCLUDED = re.compile(r".*(weights_proj|mlp\.gate)\.weight$")
# Qwen3.5-FP8: the attention and linear-attention projections (not in_proj_a/b), the shared expert, every routed
# expert one by one; not the routers, conv1d, norms, embeddings or lm_head.
QWEN3_5_FP8_WEIGHTS = re.compile(r".*\.(self_attn\.[qkvo]_proj|linear_attn\.(in_proj_qkv|in_proj_z|out_proj)"
                                 r"|mlp\.shared_expert\.\w+_proj|mlp\.experts\.\d+\.\w+_proj)\.weight$")
GPT_OSS_MXFP4_WEIGHTS = re.compile(r".*\.mlp\.experts\.(gate_up_proj|down_proj)$")
# DeepSeek-V4-Flash (contract table): attention's wq_a, wq_b, wkv, wo_a, wo_b, the indexer's wq_b, the shared
# expert and MTP's e_proj / h_proj in FP8; not the compressors, weights_proj, the router, norms, mixers, embed, head.
DEEPSEEK4_FP8_WEIGHTS = re.compile(r"(.*\.)?(attn\.(wq_a|wq_b|wkv|wo_a|wo_b|indexer\.wq_b)|ffn\.shared_experts\.w[123]"
                                   r"|[eh]_proj)\.weight$")
DEEPSEEK4_EXPERT_WEIGHTS = re.compile(r"(.*\.)?ffn\.experts\.\d+\.w[123]\.weight$")
DEEPSEEK4_F32_TENSORS = re.compile(r"(.*\.)?(hc_\w+|attn_sink|ape|gate\.bias)$")  # The rest ships in BF16.
# Kimi K2-Thinking / K2.5 / K2.6: the routed experts in INT4; `KIMI_IGNORE` is the K2.5 config's list.
KIMI_INT4_WEIGHTS = re.compile(r"(.*\.)?mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$")
# Fused experts as Qwen3.5-MoE's hub repos store them (`fuse_experts`), packed whole by compressed-tensors.
FUSED_EXPERT_WEIGHTS = re.compile(r"(.*\.)?mlp\.experts\.(gate_up_proj|down_proj)$")
KIMI_IGNORE = ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*", "re:.*lm_head.*",
               "re:vision_tower.*", "re:mm_projector.*"]


def fp8_block_quantize(w: np.ndarray, block: tuple[int, int],
                       scale_dtype: np.dtype = np.float32) -> tuple[np.ndarray, np.ndarray]:
  """(F8_E4M3 values, a scale per block in `scale_dtype`) with `w ~= float32(values) * scale` blockwise. E8M0
  scales hold powers of two only: rounded up, so that no value saturates."""
  rows, cols = w.shape
  br, bc = block
  scales = np.zeros((math.ceil(rows / br), math.ceil(cols / bc)), scale_dtype)
  values = np.zeros(w.shape, ml_dtypes.float8_e4m3fn)
  power_of_two = np.dtype(scale_dtype) == np.dtype(ml_dtypes.float8_e8m0fnu)
  for i in range(scales.shape[0]):
    for j in range(scales.shape[1]):
      tile = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc].astype(np.float32)
      scale = max(float(np.abs(tile).max()) / FP8_MAX, 1e-12)
      scales[i, j] = 2.0 ** math.ceil(math.log2(scale)) if power_of_two else scale
      scale = float(scales[i, j])  # As stored (BF16 scales are rounded), so values * scale stays within range.
      values[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = np.clip(tile / scale, -FP8_MAX, FP8_MAX).astype(
          ml_dtypes.float8_e4m3fn)
  return values, scales


def fp8_dequantize(values: np.ndarray, scales: np.ndarray, block: tuple[int, int]) -> np.ndarray:
  """float32(values) * scale of each element's block, in float32 (np.repeat, then cropped to the weight)."""
  rows, cols = values.shape
  expanded = np.repeat(np.repeat(scales.astype(np.float32), block[0], axis=0), block[1], axis=1)[:rows, :cols]
  return values.astype(np.float32) * expanded


def mxfp4_pack(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """HF's (..., in, out) float weight -> (blocks U8 (..., out, in/32, 16), scales U8 (..., out, in/32)), each value
  rounded to the nearest e2m1 number times its group's power of two."""
  stored = np.swapaxes(w.astype(np.float32), -1, -2)  # (..., out, in)
  groups = stored.reshape(stored.shape[:-1] + (-1, 32))
  peak = np.abs(groups).max(axis=-1, keepdims=True)
  exponent = np.where(peak > 0, np.ceil(np.log2(np.maximum(peak, 1e-30) / 6.0)), 0).astype(np.int32)
  scaled = groups / np.exp2(exponent)
  codes = np.abs(scaled[..., None] - E2M1_VALUES).argmin(axis=-1).astype(np.uint8)
  blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
  return blocks, (exponent[..., 0] + 127).astype(np.uint8)


def mxfp4_dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
  """(blocks, scales) -> HF's (..., in, out) float32 weight: low nibble first, times 2^(scale - 127)."""
  low, high = E2M1_VALUES[blocks & 0x0F], E2M1_VALUES[blocks >> 4]
  values = np.stack([low, high], axis=-1).reshape(blocks.shape[:-1] + (32,))
  values = values * np.exp2(scales.astype(np.float32) - 127)[..., None]
  return np.swapaxes(values.reshape(blocks.shape[:-2] + (-1,)), -1, -2)


def fp4_pack(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """DeepSeek V4's FP4: a float (..., out, in) weight -> (I8 (..., out, in/2), F8_E8M0 scales (..., out, in/32));
  MXFP4's e2m1 codes and power-of-two exponents, stored without its transpose or its 16-byte blocks."""
  blocks, exponents = mxfp4_pack(np.swapaxes(w, -1, -2))
  packed = blocks.reshape(blocks.shape[:-2] + (-1,)).view(np.int8)
  return packed, exponents.view(ml_dtypes.float8_e8m0fnu)  # E8M0 is the biased exponent: 2^(e - 127).


def fp4_dequantize(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
  """(I8 pairs (..., out, in/2), F8_E8M0 scales (..., out, in/32)) -> the float32 (..., out, in) weight."""
  low, high = E2M1_VALUES[packed.view(np.uint8) & 0x0F], E2M1_VALUES[packed.view(np.uint8) >> 4]
  values = np.stack([low, high], axis=-1).reshape(packed.shape[:-1] + (-1, 32))
  values = values * scales.astype(np.float32)[..., None]
  return values.reshape(packed.shape[:-1] + (-1,))


def load_tensors(model_dir: str) -> dict[str, np.ndarray]:
  """Every stored tensor as stored (F8 and U8 included, which `safetensors.numpy` cannot load)."""
  source = open_safetensors(model_dir)
  return {name: tensor.read() for name, tensor in source.tensors.items()}


def _load(model_dir: str) -> tuple[dict, dict[str, np.ndarray]]:
  with open(os.path.join(model_dir, "config.json")) as f:
    config = json.load(f)
  return config, load_tensors(model_dir)


def _save(model_dir: str, config: dict, tensors: Mapping[str, np.ndarray]) -> str:
  os.makedirs(model_dir, exist_ok=True)
  write_safetensors(os.path.join(model_dir, "model.safetensors"), tensors, {"format": "pt"})
  with open(os.path.join(model_dir, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
  return model_dir


def fuse_experts(model_dir: str, output_dir: str) -> str:
  """`model_dir` with each layer's routed experts fused as Qwen3.5-MoE's hub repos store them: `mlp.experts.gate_up_proj`
  (X, 2M, E), every expert's gate rows then its up rows, and `mlp.experts.down_proj` (X, E, M), each (out, in)."""
  config, tensors = _load(model_dir)
  expert = re.compile(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
  out: dict[str, np.ndarray] = {}
  parts: dict[str, dict[tuple[int, str], np.ndarray]] = {}
  for name, tensor in tensors.items():
    match = expert.match(name)
    if match:
      parts.setdefault(match.group(1), {})[(int(match.group(2)), match.group(3))] = tensor
    else:
      out[name] = tensor
  for experts, weights in parts.items():
    count = 1 + max(x for x, _ in weights)
    out[f"{experts}.gate_up_proj"] = np.stack([np.concatenate([weights[(x, "gate")], weights[(x, "up")]])
                                               for x in range(count)])
    out[f"{experts}.down_proj"] = np.stack([weights[(x, "down")] for x in range(count)])
  return _save(output_dir, config, out)


def quantize_fp8(model_dir: str, output_dir: str, block: tuple[int, int],
                 selects: Callable[[str], bool] | None = None, scale_dtype: np.dtype = np.float32) -> str:
  """`model_dir` with its projection weights in FP8 block format (DeepSeek V3's by default; Qwen3.5-FP8's with
  `selects=QWEN3_5_FP8_WEIGHTS.match, scale_dtype=ml_dtypes.bfloat16`: its scales are stored in BF16)."""
  selects = selects or (lambda n: bool(DEEPSEEK_FP8_WEIGHTS.match(n)) and not DEEPSEEK_FP8_EXCLUDED.match(n))
  config, tensors = _load(model_dir)
  out: dict[str, np.ndarray] = {}
  for name, tensor in tensors.items():
    if selects(name) and tensor.ndim == 2:
      values, scales = fp8_block_quantize(tensor, block, scale_dtype)
      out[name], out[name + "_scale_inv"] = values, scales
    else:
      out[name] = tensor
  config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                   "weight_block_size": list(block)}
  return _save(output_dir, config, out)


def quantize_mxfp4(model_dir: str, output_dir: str) -> str:
  """`model_dir` with its fused expert weights packed as MXFP4 (the openai/gpt-oss-* format)."""
  config, tensors = _load(model_dir)
  out: dict[str, np.ndarray] = {}
  for name, tensor in tensors.items():
    if GPT_OSS_MXFP4_WEIGHTS.match(name):
      out[name + "_blocks"], out[name + "_scales"] = mxfp4_pack(tensor)
    else:
      out[name] = tensor
  config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
      "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
  return _save(output_dir, config, out)


def quantize_deepseek4(model_dir: str, output_dir: str, block: tuple[int, int],
                       selects: Callable[[str], bool] | None = None,
                       scale_dtype: np.dtype = np.dtype(ml_dtypes.float8_e8m0fnu), expert_dtype: str = "fp4") -> str:
  """`model_dir` (hub names) as DeepSeek-V4-Flash ships it: the weights `selects` names (the hub's FP8 ones by
  default) in FP8 blocks beside `<module>.scale` (powers of two, E8M0 as shipped), routed experts packed FP4, the
  tensors the hub stores in F32 (mHC mixers, sinks, `ape`, the routing bias) in F32, integer ones as they are, the
  rest BF16. `expert_dtype="fp8"`: -Base, whose experts are FP8 blocks like the rest."""
  selects = selects or DEEPSEEK4_FP8_WEIGHTS.match
  config, tensors = _load(model_dir)
  out: dict[str, np.ndarray] = {}
  for name, tensor in tensors.items():
    scale_name = name.removesuffix(".weight") + ".scale"
    if DEEPSEEK4_EXPERT_WEIGHTS.match(name) and expert_dtype == "fp4":
      out[name], out[scale_name] = fp4_pack(tensor)
    elif selects(name) or DEEPSEEK4_EXPERT_WEIGHTS.match(name):
      out[name], out[scale_name] = fp8_block_quantize(tensor, block, scale_dtype)
    elif tensor.dtype.kind in "iub" or DEEPSEEK4_F32_TENSORS.match(name):
      out[name] = tensor
    else:
      out[name] = tensor.astype(ml_dtypes.bfloat16)
  config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                   "activation_scheme": "dynamic", "weight_block_size": list(block)}
  config["expert_dtype"] = expert_dtype
  return _save(output_dir, config, out)


def _int4_scheme(group_size: int):
  from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # pylint: disable=g-import-not-at-top
  return QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
      num_bits=4, type="int", symmetric=True, strategy="group", group_size=group_size, observer="minmax"))


def quantize_compressed_int4(model_dir: str, output_dir: str, block: tuple[int, int],
                             selects: Callable[[str], bool] | None = None,
                             scale_dtype: np.dtype = np.dtype(ml_dtypes.bfloat16), seed: int = 0) -> str:
  """`model_dir` with the weights `selects` names (Kimi's routed experts by default) replaced by random INT4 codes
  over all 16 values times a `scale_dtype` scale per `block[1]` inputs of a row, the scales spread over 2^-2..2^3 of
  the weight's own magnitude (so that a scale read for the wrong group changes values), packed by
  compressed-tensors' compressor. The other tensors are kept as they are."""
  import torch  # pylint: disable=g-import-not-at-top
  from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # pylint: disable=g-import-not-at-top

  group_size = block[1]
  scheme = _int4_scheme(group_size)
  selects = selects or KIMI_INT4_WEIGHTS.match
  rng = np.random.default_rng(seed)
  config, tensors = _load(model_dir)
  out: dict[str, np.ndarray] = {}
  for name, tensor in tensors.items():
    if not (selects(name) and tensor.ndim in (2, 3)):
      out[name] = tensor
      continue
    *lead, rows, cols = tensor.shape
    groups = -(-cols // group_size)
    magnitude = float(np.abs(tensor).mean()) / 4
    scale = (magnitude * 2.0 ** rng.integers(-2, 4, (*lead, rows, groups))).astype(scale_dtype)
    codes = rng.integers(-8, 8, tensor.shape).astype(np.float32)
    weight = codes * np.repeat(scale.astype(np.float32), group_size, axis=-1)[..., :cols]
    compressed = PackedQuantizationCompressor.compress(
        {"weight": torch.from_numpy(weight), "weight_scale": torch.from_numpy(scale.astype(np.float32)).to(
            getattr(torch, np.dtype(scale_dtype).name))}, scheme)
    module = name.removesuffix(".weight")  # Fused experts (3-D) are parameters: their own name is the module's.
    for key, value in compressed.items():
      out[f"{module}.{key}"] = (value.to(torch.float32).numpy().astype(scale_dtype) if key == "weight_scale"
                                else value.numpy())
  quantization = {
      "config_groups": {"group_0": {"input_activations": None, "output_activations": None, "targets": ["Linear"],
                                    "weights": {**scheme.weights.model_dump(mode="json"), "observer_kwargs": {}}}},
      "format": "pack-quantized", "ignore": KIMI_IGNORE, "kv_cache_scheme": None, "quant_method": "compressed-tensors",
      "quantization_status": "compressed"}
  (config["text_config"] if isinstance(config.get("text_config"), dict) else config)["quantization_config"] = quantization
  return _save(output_dir, config, out)


def _decompress_int4(tensors: Mapping[str, np.ndarray], module: str, group_size: int) -> np.ndarray:
  """One module's codes as compressed-tensors' own unpacker reads them, times their scales in float32 (its
  decompressor multiplies in the scales' dtype, bfloat16, which rounds 37% of Kimi's values)."""
  import torch  # pylint: disable=g-import-not-at-top
  from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32  # pylint: disable=g-import-not-at-top

  shape = tuple(int(d) for d in tensors[f"{module}.weight_shape"])
  codes = unpack_from_int32(torch.from_numpy(tensors[f"{module}.weight_packed"]), 4, torch.Size(shape)).numpy()
  scale = np.repeat(tensors[f"{module}.weight_scale"].astype(np.float32), group_size, axis=-1)[..., : shape[-1]]
  return codes.astype(np.float32) * scale


def is_quantized(model_dir: str) -> bool:
  with open(os.path.join(model_dir, "config.json")) as f:
    config = json.load(f)
  return "quantization_config" in config or "quantization_config" in (config.get("text_config") or {})


def dequantize(model_dir: str, output_dir: str, dtype=np.float32) -> str:
  """A quantized checkpoint (either format) back to plain floating tensors in `dtype`, without
  quantization_config: what transformers runs as the reference for a quantized conversion."""
  config, tensors = _load(model_dir)
  scope = config["text_config"] if "quantization_config" in config.get("text_config", {}) else config
  quantization = scope.pop("quantization_config")
  config.pop("expert_dtype", None)
  if quantization["quant_method"] == "compressed-tensors":
    if config.get("model_type") == "kimi_k2":  # Remote code's name for what transformers runs as deepseek_v3.
      config["model_type"] = "deepseek_v3"
    group_size = quantization["config_groups"]["group_0"]["weights"]["group_size"]
    modules = [n.removesuffix(".weight_packed") for n in tensors if n.endswith(".weight_packed")]
    out = {n: t.astype(dtype) if t.dtype.kind == "f" or t.dtype == ml_dtypes.bfloat16 else t
           for n, t in tensors.items() if not re.match(r".*\.weight_(packed|scale|shape)$", n)}
    for module in modules:
      weight = _decompress_int4(tensors, module, group_size).astype(dtype)
      out[module if weight.ndim == 3 else f"{module}.weight"] = weight  # Fused experts: the parameter's name.
    return _save(output_dir, config, out)
  block = tuple(quantization.get("weight_block_size", ()))
  scale_of = lambda n: next((s for s in (n + "_scale_inv", n.removesuffix(".weight") + ".scale") if s in tensors),
                            None)
  scales = {scale_of(n) for n in tensors} - {None}
  out: dict[str, np.ndarray] = {}
  for name, tensor in tensors.items():
    scale = scale_of(name)
    if name in scales or name.endswith("_scales"):
      continue
    if scale is not None and tensor.dtype == np.int8:  # DeepSeek V4's packed FP4.
      out[name] = fp4_dequantize(tensor, tensors[scale]).astype(dtype)
    elif scale is not None:
      out[name] = fp8_dequantize(tensor, tensors[scale], block).astype(dtype)
    elif name.endswith("_blocks"):
      base = name[: -len("_blocks")]
      out[base] = mxfp4_dequantize(tensor, tensors[base + "_scales"]).astype(dtype)
    elif tensor.dtype.kind in "iub":  # Integer buffers (DeepSeek V4's tid2eid) keep their dtype.
      out[name] = tensor
    else:
      out[name] = tensor.astype(dtype) if tensor.dtype != dtype else tensor
  return _save(output_dir, config, out)
