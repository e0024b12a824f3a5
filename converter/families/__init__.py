"""Every supported model family, found by HF architecture, and the one resolver of family, target and runtime.

A family is one module in this package that defines `FAMILY`; nothing else needs to list it.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

from converter.errors import ConversionError
from converter.families.base import Alternatives, Family, LayerGroup, Layout, Param
from converter.families.runtime import Decoder, MaxTextConfig, Runtime
from converter.model_config import ModelConfig


def _discover() -> tuple[Family, ...]:
  found = []
  for module in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.endswith("_test")):
    family = getattr(importlib.import_module(f"{__name__}.{module}"), "FAMILY", None)
    if isinstance(family, Family):
      found.append(family)
  return tuple(found)


FAMILIES: tuple[Family, ...] = _discover()


def supported_architectures() -> list[str]:
  return sorted({a for f in FAMILIES for a in f.architectures})


def family_for_architecture(architecture: str, config_path: str = "config.json",
                            config: ModelConfig | None = None) -> Family:
  """The family that reads `architecture` (and, given, `config`: some architectures are read by several)."""
  for family in FAMILIES:
    if architecture in family.architectures and (config is None or family.reads(config)):
      return family
  raise ConversionError(
      f"{config_path}: unsupported architecture {architecture!r}; supported: {', '.join(supported_architectures())}"
  )


def family_by_name(name: str) -> Family:
  for family in FAMILIES:
    if family.name == name:
      return family
  raise ConversionError(f"unknown family {name!r}; known: {', '.join(f.name for f in FAMILIES)}")


@dataclasses.dataclass(frozen=True)
class ResolvedModel:
  """A checkpoint's family, the MaxText model it targets, and what that MaxText computes."""

  family: Family
  config: ModelConfig
  target: str
  runtime: Runtime

  def layout(self, target_vocab: int, scan_layers: bool) -> Layout:
    return self.family.layout(self.config, self.target, target_vocab, scan_layers)

  def warnings(self) -> list[str]:
    """What the target cannot reproduce; raises ConversionError for what it must refuse."""
    return list(self.family.check(self.config, self.target))


def resolve(config: ModelConfig, *, target_model: str | None = None, family: str | None = None) -> ResolvedModel:
  """The family (by name, else by architecture), the target (given, else inferred) and its runtime."""
  fam = family_by_name(family) if family else family_for_architecture(config.architecture, config.path, config)
  if config.architecture not in fam.architectures:
    raise ConversionError(f"{config.path}: architecture {config.architecture!r} is not one family {fam.name} converts"
                          f" ({', '.join(fam.architectures)})")
  if target_model is None:
    target = fam.infer_target(config)
  elif fam.target_prefix(target_model):
    target = target_model
  else:
    raise ConversionError(
        f"--target_model={target_model} is not a MaxText model {fam.name} checkpoints ({config.path}) convert to;"
        f" expected one of: {', '.join(t + '-*' for t in fam.targets)}"
    )
  return ResolvedModel(fam, config, target, fam.runtime(config, target))


__all__ = ["FAMILIES", "Alternatives", "Decoder", "Family", "LayerGroup", "Layout", "MaxTextConfig", "Param", "ResolvedModel",
           "Runtime", "family_by_name", "family_for_architecture", "resolve", "supported_architectures"]
