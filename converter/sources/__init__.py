"""Tensor sources: a checkpoint's tensors by name, read region by region as floating arrays.

`open_source` picks the source from `quantization_config.quant_method` in config.json: none for plain
safetensors, `fp8` (block-scaled FP8) or `mxfp4`. Any family reads any of them the same way.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from converter.errors import ConversionError
from converter.sources import fp8, mxfp4
from converter.sources.base import FLOATING, QuantizedSource, Region, SourceTensor, TensorSource, region_shape
from converter.sources.safetensors import SAFETENSORS_DTYPES, SafetensorsSource, TensorInfo, open_safetensors

QUANTIZED_SOURCES: Mapping[str, Callable[[SafetensorsSource, Mapping[str, Any], str], QuantizedSource]] = {
    fp8.QUANT_METHOD: fp8.fp8_source,
    mxfp4.QUANT_METHOD: mxfp4.mxfp4_source,
}


def quant_method(config: Mapping[str, Any]) -> str | None:
  """config.json's `quantization_config.quant_method` (also under `text_config`), or None."""
  for scope in (config, config.get("text_config") or {}):
    quantization = scope.get("quantization_config") if isinstance(scope, Mapping) else None
    if quantization:
      return str(quantization.get("quant_method", "")) if isinstance(quantization, Mapping) else repr(quantization)
  return None


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
  scope = config if config.get("quantization_config") else config["text_config"]
  return QUANTIZED_SOURCES[method](plain, scope["quantization_config"], config_path)


__all__ = ["FLOATING", "QUANTIZED_SOURCES", "Region", "SAFETENSORS_DTYPES", "SafetensorsSource", "SourceTensor",
           "TensorInfo", "TensorSource", "check_quantization", "open_safetensors", "open_source", "quant_method",
           "region_shape"]
