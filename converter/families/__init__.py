"""Every supported model family, found by HF architecture, and the one resolver of family, target and runtime.

A family is one module in this package that defines `FAMILY`; nothing else needs to list it.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Iterable, Sequence

from converter.errors import ConversionError
from converter.families import common
from converter.families.base import (TOWER_SUBTREES, Alternatives, Family, LayerGroup, Layout, Param, Towers, leaf_index,
                                     leaf_shape)
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


def family_by_name(name: str, named_by: str = "--family") -> Family:
  """The family called `name`; `named_by` says where the name came from (a flag, a checkpoint's record)."""
  for family in FAMILIES:
    if family.name == name:
      return family
  raise ConversionError(f"{named_by}: unknown family {name!r}; known: {', '.join(f.name for f in FAMILIES)}")


@dataclasses.dataclass(frozen=True)
class ResolvedModel:
  """A checkpoint's family, the MaxText model it targets, what that MaxText computes, and the towers converted
  with the text decoder (None: text only)."""

  family: Family
  config: ModelConfig
  target: str
  runtime: Runtime
  towers: Towers | None = None
  skipped_towers: Towers | None = None  # A multimodal checkpoint's towers left out (--text_only).

  @property
  def multimodal(self) -> bool:
    return self.towers is not None

  def layout(self, target_vocab: int, scan_layers: bool) -> Layout:
    layout = self.family.layout(self.config, self.target, target_vocab, scan_layers)
    if self.towers is None:
      return layout
    return dataclasses.replace(layout, top=layout.top + self.towers.params)

  def stored_scanned(self, leaf_paths: Iterable[Sequence[str]]) -> bool:
    """Whether a checkpoint whose leaves lie at `leaf_paths` (below its parameters) stacks its layers: some leaf
    lies in a group the scanned layout stacks (`decoder/layers`, DeepSeek's `dense_layers` / `moe_layers`, ...).
    For checkpoints that do not record `scan_layers`."""
    stacked = {tuple(g.path) for g in self.layout(self.config.vocab_size, True).groups if g.stacked}
    return any(tuple(path[:len(group)]) == group for path in leaf_paths for group in stacked)

  def warnings(self) -> list[str]:
    """What the target cannot reproduce; raises ConversionError for what it must refuse."""
    return list(self.family.check(self.config, self.target))

  def ignored_tensors(self) -> dict[str, str]:
    """Regexes of HF tensors read nowhere on purpose, and the reason a conversion states for skipping them."""
    ignored = dict(self.family.ignored_tensors(self.config))
    if self.skipped_towers is not None:
      ignored.update({p: f"{what} (--text_only)" for p, what in self.skipped_towers.owns.items()})
    return ignored

  def tensor_aliases(self) -> tuple[tuple[str, str], ...]:
    return tuple(self.family.tensor_aliases(self.config))


def resolve(config: ModelConfig, *, target_model: str | None = None, family: str | None = None,
            family_named_by: str = "--family", text_only: bool = False) -> ResolvedModel:
  """The family (by name, else by architecture), the target (given, else inferred), its runtime and, unless
  `text_only`, the checkpoint's towers."""
  fam = (family_by_name(family, family_named_by) if family
         else family_for_architecture(config.architecture, config.path, config))
  common.rope_parameters(config)  # Refused as transformers would refuse it, whether or not the family reads it.
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
  runtime = fam.runtime(config, target)
  try:
    towers = fam.towers(config, target)
  except ConversionError as e:
    if not text_only:
      raise
    # Towers MaxText could not run as transformers does need not run: whatever the text decoder leaves unread
    # is theirs, named in the skip warning.
    towers = Towers((), (), {r".*": f"not the text decoder (the towers MaxText cannot run: {e})"})
  if towers is None or text_only:
    return ResolvedModel(fam, config, target, runtime, skipped_towers=towers)
  runtime = runtime.replace_config(use_multimodal=True, towers=towers.overrides)
  return ResolvedModel(fam, config, target, runtime, towers)


__all__ = ["FAMILIES", "TOWER_SUBTREES", "leaf_index", "leaf_shape", "Alternatives", "Decoder", "Family", "LayerGroup", "Layout", "MaxTextConfig", "Param", "ResolvedModel", "Towers",
           "Runtime", "family_by_name", "family_for_architecture", "resolve", "supported_architectures"]
