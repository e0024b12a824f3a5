"""Tensor sources: a checkpoint's tensors by name, read region by region as floating arrays.

`open_source` picks the source from `quantization_config.quant_method` in config.json: none for plain
safetensors, `fp8` (block-scaled FP8, with DeepSeek V4's packed FP4 experts where `expert_dtype` says so),
`mxfp4` or `compressed-tensors` (Kimi K2's INT4 experts; INT8 and FP8 per tensor, channel, group or block).
Any family reads any of them the same way.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from converter.errors import ConversionError
from converter.sources import compressed, fp8, mxfp4
from converter.sources.base import FLOATING, QuantizedSource, Region, SourceTensor, TensorSource, region_shape
from converter.sources.safetensors import SAFETENSORS_DTYPES, SafetensorsSource, TensorInfo, open_safetensors

QUANTIZED_SOURCES: Mapping[str, Callable[[SafetensorsSource, Mapping[str, Any], str], QuantizedSource]] = {
    fp8.QUANT_METHOD: fp8.fp8_source,
    mxfp4.QUANT_METHOD: mxfp4.mxfp4_source,
    compressed.QUANT_METHOD: compressed.compressed_tensors_source,
}


def _scope(config: Mapping[str, Any]) -> Mapping[str, Any] | None:
  """The config section holding `quantization_config` (the config, or its `text_config`), or None."""
  for scope in (config, config.get("text_config") or {}):
    if isinstance(scope, Mapping) and scope.get("quantization_config"):
      return scope
  return None


def quant_method(config: Mapping[str, Any]) -> str | None:
  """config.json's `quantization_config.quant_method` (also under `text_config`), or None."""
  scope = _scope(config)
  if scope is None:
    return None
  quantization = scope["quantization_config"]
  return str(quantization.get("quant_method", "")) if isinstance(quantization, Mapping) else repr(quantization)


def quantization_config(config: Mapping[str, Any], config_path: str) -> Mapping[str, Any]:
  """`quantization_config` with DeepSeek V4's `expert_dtype` in it: the hub's config.json has it beside
  quantization_config, transformers 5.24 moves it inside; both forms read the same."""
  scope = _scope(config)
  quantization = dict(scope["quantization_config"])
  key = fp8.EXPERT_DTYPE
  outside = scope.get(key)
  if outside is not None:
    if quantization.get(key, outside) != outside:
      raise ConversionError(f"{config_path}: {key} is {outside!r} but quantization_config.{key} is"
                            f" {quantization[key]!r}")
    quantization[key] = outside
  return quantization


def check_quantization(config: Mapping[str, Any], config_path: str) -> None:
  """Refuses an unknown `quant_method` before any weight file is opened."""
  method = quant_method(config)
  if method is not None and method not in QUANTIZED_SOURCES:
    raise ConversionError(
        f"{config_path}: quantization_config.quant_method {method!r} is not supported; supported:"
        f" {', '.join(sorted(QUANTIZED_SOURCES))} (or an unquantized checkpoint)"
    )


def open_source(directory: str, config: Mapping[str, Any], config_path: str) -> TensorSource:
  """The checkpoint in `directory`, its quantized weights presented dequantized as `config` says."""
  check_quantization(config, config_path)
  plain = open_safetensors(directory)
  method = quant_method(config)
  if method is None:
    return plain
  return QUANTIZED_SOURCES[method](plain, quantization_config(config, config_path), config_path)


__all__ = ["FLOATING", "QUANTIZED_SOURCES", "Region", "SAFETENSORS_DTYPES", "SafetensorsSource", "SourceTensor",
           "TensorInfo", "TensorSource", "check_quantization", "open_safetensors", "open_source", "quant_method",
           "quantization_config", "region_shape"]
