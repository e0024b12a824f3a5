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
  layer_stride: int = 1  # MaxText layer i reads HF layer i * layer_stride + layer_offset (Gemma2 pairs).
  layer_offset: int = 0

  def hf_layer(self, layer: int) -> int:
    return layer * self.layer_stride + self.layer_offset


@dataclasses.dataclass(frozen=True)
class DecoderSemantics:
  """How MaxText's decoder for the target computes, as far as a conversion or a reference forward cares."""

  qk_norm: bool = False
  query_scale_in_kernel: bool = False  # True: 1/sqrt(D) baked into the query kernel, attention runs unscaled.
  rope_interleaved: bool = False  # llama3.1 rotary embedding: q/k kernels permuted to interleaved pairs.
  llama3_rope_scaling: bool = False  # MaxText's llama3.1 rope: factor 8, low 1, high 4, original context 8192.
  attention_bias: bool = False
  moe: bool = False
  moe_block: str = "moe_block"
  # Norms. Leaf names of the norm before attention and before the MLP, and of the optional norms on their outputs
  # ("": none). HF norms computing x * (offset + w) are stored as w + offset (MaxText computes x * scale).
  pre_attention_norm: str = "pre_self_attention_layer_norm"
  pre_mlp_norm: str = "post_self_attention_layer_norm"
  post_attention_norm: str = ""
  post_mlp_norm: str = ""
  norm_scale_offset: float = 0.0
  layer_norm_epsilon: float | None = None  # Fixed by the decoder (Gemma: 1e-6); None: normalization_layer_epsilon.
  mlp_activation: str = "silu"  # "silu" or "gelu_tanh" (MaxText's "gelu" is jax.nn.gelu, the tanh approximation).
  # Attention. query_scale: the factor on q.k (None: head_dim**-0.5), baked in or applied at run time.
  query_scale: float | None = None
  attn_logits_soft_cap: float | None = None
  sliding_window: int | None = None  # Local layers see the last `sliding_window` positions, themselves included.
  local_layers: tuple[bool, ...] = ()  # Repeating over HF layers: True = local (sliding window, local rope).
  rope_theta: float | None = None  # Global layers' rope base; None: config.json's rope_theta.
  local_rope_theta: float | None = None  # None: the global one.
  rope_linear_scaling: float = 1.0  # Divides global layers' rope frequencies (local layers unscaled, as gemma3).
  # Embeddings and logits.
  embedding_scale: float = 1.0  # Baked into the embedding table at conversion (Gemma: sqrt(E)).
  normalize_embedding_logits: bool = False  # Tied logits divided by sqrt(E) (MaxText's normalize_embedding_logits).
  final_logits_soft_cap: float | None = None  # MaxText applies it to tied logits only.
  # Layer structure. One MaxText layer holds one HF layer per suffix, every module name suffixed (Gemma2:
  # "_local", "_global"); layer_groups: where MaxText keeps its layers (None: standard_layer_groups).
  sublayer_suffixes: tuple[str, ...] = ("",)
  layer_groups: Callable[[int, bool], list[LayerGroup]] | None = None

  def is_local(self, hf_layer: int) -> bool:
    return bool(self.local_layers) and self.local_layers[hf_layer % len(self.local_layers)]


@dataclasses.dataclass(frozen=True)
class LayerGroup:
  """Where MaxText keeps some decoder layers: one stacked subtree (layers on the scan axis) or one layer."""

  path: tuple[str, ...]
  layers: tuple[int, ...]
  stacked: bool


def standard_layer_groups(num_layers: int, scan_layers: bool) -> list[LayerGroup]:
  """`decoder/layers` with every layer on the scan axis, or `decoder/layers_{i}`."""
  if scan_layers:
    return [LayerGroup(("decoder", "layers"), tuple(range(num_layers)), True)]
  return [LayerGroup(("decoder", f"layers_{i}"), (i,), False) for i in range(num_layers)]


@dataclasses.dataclass(frozen=True)
class Layout:
  top: tuple[Param, ...]
  layer: tuple[Param, ...]
  num_layers: int  # MaxText decoder layers (Gemma2's hold two HF layers each).
  layer_groups: Callable[[int, bool], list[LayerGroup]] = standard_layer_groups


@dataclasses.dataclass(frozen=True)
class Family:
  """A model family: the HF architectures it reads, the MaxText models it can target, and its layout.

  `targets` are MaxText model-name prefixes ("llama3.1" covers llama3.1-8b and llama3.1-70b); `infer_target`
  picks one from config.json; `semantics` says how the chosen target's decoder computes; `check` returns
  warnings about what the target cannot reproduce (it raises ConversionError for what it must refuse).
  """

  name: str
  architectures: tuple[str, ...]
  targets: tuple[str, ...]
  infer_target: Callable[[ModelConfig], str]
  semantics: Callable[[ModelConfig, str], DecoderSemantics]
  layout: Callable[[ModelConfig, DecoderSemantics, int], Layout]  # (config, semantics, target vocab size)
  check: Callable[[ModelConfig, str], list[str]] = lambda cfg, target: []
  extra_overrides: Callable[[ModelConfig], dict] | None = None  # MaxText config keys beyond the dense ones.
  ignored_tensors: tuple[str, ...] = (r".*\.rotary_emb\.inv_freq$",)

  def target_prefix(self, target_model: str) -> str:
    """The longest declared prefix `target_model` starts with ("llama3.1-8b" -> "llama3.1")."""
    matches = [t for t in self.targets if target_model == t or target_model.startswith(t + "-")]
    return max(matches, key=len) if matches else ""
