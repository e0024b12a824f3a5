"""Every supported model family, looked up by HF architecture. Adding a family: one file here, one line below."""

from __future__ import annotations

from converter.errors import ConversionError
from converter.families import gemma, gemma2, gemma3, llama, mistral, mixtral, qwen2, qwen3, qwen3_moe
from converter.families.base import DecoderSemantics, Family, LayerGroup, Layout, Param

FAMILIES: tuple[Family, ...] = (
    llama.FAMILY,
    mistral.FAMILY,
    mixtral.FAMILY,
    qwen2.FAMILY,
    qwen3.FAMILY,
    qwen3_moe.FAMILY,
    gemma.FAMILY,
    gemma2.FAMILY,
    gemma3.FAMILY,
)


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


def resolve_target(family: Family, config_path: str, target_model: str | None, inferred: str) -> str:
  """The user's --target_model if this family can produce it, else the one inferred from config.json."""
  if target_model is None:
    return inferred
  if not family.target_prefix(target_model):
    raise ConversionError(
        f"--target_model={target_model} is not a MaxText model {family.name} checkpoints ({config_path}) convert to;"
        f" expected one of: {', '.join(t + '-*' for t in family.targets)}"
    )
  return target_model


__all__ = ["FAMILIES", "DecoderSemantics", "Family", "LayerGroup", "Layout", "Param", "family_by_name", "family_for_architecture",
           "resolve_target", "supported_architectures"]
