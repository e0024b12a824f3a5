"""Every supported model family, looked up by HF architecture. Adding a family: one file here, one line below."""

from __future__ import annotations

from converter.errors import ConversionError
from converter.families import qwen3
from converter.families.base import DecoderSemantics, Family, Layout, Param

FAMILIES: tuple[Family, ...] = (qwen3.FAMILY,)


def supported_architectures() -> list[str]:
  return sorted(a for f in FAMILIES for a in f.architectures)


def family_for_architecture(architecture: str, config_path: str = "config.json") -> Family:
  for family in FAMILIES:
    if architecture in family.architectures:
      return family
  raise ConversionError(
      f"{config_path}: unsupported architecture {architecture!r}; supported: {', '.join(supported_architectures())}"
  )


def family_by_name(name: str) -> Family:
  for family in FAMILIES:
    if family.name == name:
      return family
  raise ConversionError(f"unknown family {name!r}; known: {', '.join(f.name for f in FAMILIES)}")


__all__ = ["FAMILIES", "DecoderSemantics", "Family", "Layout", "Param", "family_by_name", "family_for_architecture",
           "supported_architectures"]
