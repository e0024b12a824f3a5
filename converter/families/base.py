"""The vocabulary family files are written in: which HF tensor becomes which MaxText leaf, and how.

A family file describes one layer and the tensors outside the layers; `converter/plan.py` does the rest
(layer stacking for scanned checkpoints, expert stacking, dtype casts, shape checks) once for every family.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from converter.model_config import ModelConfig
from converter.ops import Op

Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Param:
  """One MaxText leaf made from one HF tensor (or one per expert, stacked on a new leading axis).

  `maxtext` is a "/"-joined path: under the decoder layer for layer params, under `params/params` otherwise.
  `hf` may contain "{layer}" and "{expert}".
  """

  maxtext: str
  hf: str
  hf_shape: Shape
  ops: tuple[Op, ...] = ()
  experts: int = 0


@dataclasses.dataclass(frozen=True)
class DecoderSemantics:
  """How MaxText's decoder for the target computes, as far as a conversion or a reference forward cares."""

  qk_norm: bool = False
  query_scale_in_kernel: bool = False  # True: 1/sqrt(D) baked into the query kernel, attention runs unscaled.
  rope_interleaved: bool = False  # llama3.1 rotary embedding: q/k kernels permuted to interleaved pairs.
  attention_bias: bool = False
  moe: bool = False


@dataclasses.dataclass(frozen=True)
class Layout:
  top: tuple[Param, ...]
  layer: tuple[Param, ...]
  num_layers: int


@dataclasses.dataclass(frozen=True)
class Family:
  """A model family: the HF architectures it reads, the MaxText model it targets, and its layout."""

  name: str
  architectures: tuple[str, ...]
  default_target: str  # MaxText model-name prefix written to the checkpoint's metadata, e.g. "qwen3".
  semantics: Callable[[ModelConfig, str], DecoderSemantics]
  layout: Callable[[ModelConfig, DecoderSemantics, int], Layout]  # (config, semantics, target vocab size)
  ignored_tensors: tuple[str, ...] = (r".*\.rotary_emb\.inv_freq$",)
  extra_overrides: Callable[[ModelConfig], dict] | None = None  # MaxText config keys beyond the dense ones.
