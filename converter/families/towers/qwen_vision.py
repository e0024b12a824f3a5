"""The Qwen vision tower and its patch mergers (MaxText `vision_encoder_block: qwen3_vl | qwen3_5 | qwen3_omni`).

One tower serves Qwen3-VL, Qwen3.5 and the Qwen3-Omni thinker; MaxText builds all three from the same classes
(`Qwen3OmniMoeVisionEncoder` / `Qwen3OmniMoeVisionProjector`) under different class names, and HF names the patch
mergers two ways. A `Kind` holds both differences, so a family file only says which kind its checkpoint carries and
where the tower's tensors are (`model.visual`, `thinker.visual`).

The patch embedding is a 3-D conv (HF (Dv, C, tp, p, p) -> DHWIO), the fused `qkv` projection is split in thirds
([q; k; v] rows, not per head), the position table is copied (MaxText interpolates it as transformers does, row r =
grid (r // side, r % side)), and no rotary permutation is needed (rotate-half on both sides). The deepstack mergers
become `merger_{j}` inside the encoder (the j-th entry of `deepstack_visual_indexes`, normalised after the spatial
shuffle, so their norm is m^2 Dv wide); the final merger is the projector's (normalised before it: Dv wide).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from converter import ops
from converter.errors import ConversionError
from converter.families.base import Param, Towers
from converter.families.towers import parts
from converter.model_config import ModelConfig

LAYER_NORM_EPS = 1e-6  # transformers hard-codes the tower's and mergers' LayerNorm eps; MaxText uses the text eps.
TANH_GELU = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")  # MaxText's blocks apply jax.nn.gelu (tanh form).


@dataclasses.dataclass(frozen=True)
class MergerNames:
  """How HF names the patch mergers: the deepstack list, and each merger's norm and two linears."""

  deepstack: str
  norm: str
  fc1: str
  fc2: str


QWEN3_VL_MERGERS = MergerNames("deepstack_merger_list", "norm", "linear_fc1", "linear_fc2")
OMNI_MERGERS = MergerNames("merger_list", "ln_q", "mlp.0", "mlp.2")


@dataclasses.dataclass(frozen=True)
class Kind:
  """One MaxText form of the tower: its encoder and projector class names, HF's merger names, whether it has
  deepstack mergers, and the image token ids MaxText hard-codes for its model names (checked against config.json)."""

  encoder: str
  projector: str
  mergers: MergerNames
  deepstack: bool
  image_token: int
  vision_start_token: int

  @property
  def encoder_path(self) -> str:
    return f"vision_encoder/{self.encoder}"

  @property
  def projector_path(self) -> str:
    return f"vision_encoder/{self.projector}"


QWEN3_VL = Kind("Qwen3VLVisionEncoder_0", "Qwen3VLVisionProjector_0", QWEN3_VL_MERGERS, True, 151655, 151652)
QWEN3_5 = Kind("Qwen3_5MoeVisionEncoder_0", "Qwen3_5MoeVisionProjector_0", QWEN3_VL_MERGERS, False, 248056, 248053)
QWEN3_OMNI = Kind("Qwen3OmniMoeVisionEncoder_0", "Qwen3OmniMoeVisionProjector_0", OMNI_MERGERS, True, 151655, 151652)


@dataclasses.dataclass(frozen=True)
class Dims:
  """The tower's dimensions from `vision_config` (transformers' attribute names and their config.json aliases)."""

  hidden: int  # Dv
  heads: int  # Hv
  intermediate: int  # Iv
  depth: int  # Nv
  channels: int
  patch: int  # p
  temporal_patch: int  # tp
  merge: int  # m
  out_hidden: int  # the decoder's E
  positions: int  # Npos = side^2
  deepstack: tuple[int, ...]
  rope_theta: int

  @property
  def merged(self) -> int:
    """A merger's width: m^2 patches of Dv side by side."""
    return self.merge * self.merge * self.hidden


def dims(cfg: ModelConfig, kind: Kind) -> Dims:
  """The tower's dims, checked against what MaxText fixes rather than reads (ConversionError naming the key)."""
  v = parts.sub_config(cfg, "vision_config")

  def need(*keys: str, default: Any = None) -> Any:
    for key in keys:
      if v.get(key) is not None:
        return v[key]
    return parts.require(cfg, v, "vision_config", keys[0], default)

  def integer(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
      raise ConversionError(f"{cfg.path}: vision_config.{key}={value!r}: MaxText's Qwen tower takes one positive"
                            " integer here")
    return value

  rope = v.get("rope_parameters") or {}
  theta = rope.get("rope_theta", v.get("rope_theta", 10000))
  if float(theta) != int(theta):
    raise ConversionError(f"{cfg.path}: vision_config rope_theta={theta}: MaxText's rope_theta_for_vit is an integer")
  deepstack = tuple(int(i) for i in (v.get("deepstack_visual_indexes") or ())) if kind.deepstack else ()
  d = Dims(
      hidden=integer(need("hidden_size"), "hidden_size"),
      heads=integer(need("num_heads", "num_attention_heads"), "num_heads"),
      intermediate=integer(need("intermediate_size"), "intermediate_size"),
      depth=integer(need("depth", "num_hidden_layers"), "depth"),
      channels=integer(need("in_channels", "num_channels", default=3), "in_channels"),
      patch=integer(need("patch_size"), "patch_size"),
      temporal_patch=integer(need("temporal_patch_size"), "temporal_patch_size"),
      merge=integer(need("spatial_merge_size"), "spatial_merge_size"),
      out_hidden=integer(need("out_hidden_size"), "out_hidden_size"),
      positions=integer(need("num_position_embeddings"), "num_position_embeddings"),
      deepstack=deepstack,
      rope_theta=int(theta),
  )
  _check(cfg, v, kind, d)
  return d


def towers(cfg: ModelConfig, *, prefix: str, kind: Kind) -> Towers:
  """The tower, its deepstack mergers and the projector, read from `prefix` (e.g. "model.visual",
  "thinker.visual")."""
  d = dims(cfg, kind)
  enc, names = kind.encoder_path, kind.mergers
  Dv, C, tp, p = d.hidden, d.channels, d.temporal_patch, d.patch
  params: list[Param] = [
      Param(f"{enc}/patch_embed/proj/kernel", f"{prefix}.patch_embed.proj.weight", (Dv, C, tp, p, p),
            (ops.Permute((2, 3, 4, 1, 0)),)),
      Param(f"{enc}/patch_embed/proj/bias", f"{prefix}.patch_embed.proj.bias", (Dv,)),
      Param(f"{enc}/pos_embed_interpolate/pos_embed", f"{prefix}.pos_embed.weight", (d.positions, Dv)),
  ]
  for i in range(d.depth):
    params += _block(f"{enc}/blocks_{i}", f"{prefix}.blocks.{i}", d)
  for j in range(len(d.deepstack)):
    params += _merger(f"{enc}/merger_{j}", f"{prefix}.{names.deepstack}.{j}", names, d, d.merged)
  params += _merger(f"{kind.projector_path}/merger", f"{prefix}.merger", names, d, Dv)
  return Towers(tuple(params), overrides(d), {rf"{_escape(prefix)}\.": "the vision tower and its patch mergers"})


def overrides(d: Dims) -> tuple[tuple[str, Any], ...]:
  """The MaxText `*_for_vit` keys describing the tower (its model yml's values are the real checkpoints')."""
  return (("hidden_size_for_vit", d.hidden), ("intermediate_size_for_vit", d.intermediate),
          ("num_attention_heads_for_vit", d.heads), ("num_hidden_layers_for_vit", d.depth),
          ("num_channels_for_vit", d.channels), ("patch_size_for_vit", d.patch),
          ("temporal_patch_size_for_vit", d.temporal_patch), ("spatial_merge_size_for_vit", d.merge),
          ("out_hidden_size_for_vit", d.out_hidden), ("num_position_embeddings_for_vit", d.positions),
          ("deepstack_visual_indexes_for_vit", list(d.deepstack)), ("rope_theta_for_vit", d.rope_theta))


def _block(mt: str, hf: str, d: Dims) -> tuple[Param, ...]:
  """A vision block: LayerNorms, attention from the fused qkv (rows in thirds), the tanh-GELU MLP."""
  Dv, Hv = d.hidden, d.heads
  dv = Dv // Hv
  thirds = (Dv, Dv, Dv)
  attn = f"{mt}/attn/attn"
  qkv = tuple(
      Param(f"{attn}/{name}/kernel", f"{hf}.attn.qkv.weight", (3 * Dv, Dv),
            (ops.Slot(0, 1, thirds, k),) + ops.to_heads_kernel(Dv, Hv, dv))
      for k, name in enumerate(("query", "key", "value"))
  ) + tuple(
      Param(f"{attn}/{name}/bias", f"{hf}.attn.qkv.bias", (3 * Dv,),
            (ops.Slot(0, 1, thirds, k),) + ops.to_heads_bias(Hv, dv))
      for k, name in enumerate(("query", "key", "value"))
  )
  return (parts.norm(f"{mt}/ln1", f"{hf}.norm1", Dv) + parts.norm(f"{mt}/ln2", f"{hf}.norm2", Dv) + qkv
          + parts.out_projection(f"{attn}/out", f"{hf}.attn.proj", Dv, Hv)
          + parts.dense(f"{mt}/mlp", f"{hf}.mlp.linear_fc1", Dv, d.intermediate)
          + parts.dense(f"{mt}/mlp_out", f"{hf}.mlp.linear_fc2", d.intermediate, Dv))


def _merger(mt: str, hf: str, names: MergerNames, d: Dims, norm_width: int) -> tuple[Param, ...]:
  """A patch merger: LayerNorm (`norm_width`: Dv before the shuffle, m^2 Dv after), then m^2 Dv -> m^2 Dv -> E."""
  return (parts.norm(f"{mt}/ln_q", f"{hf}.{names.norm}", norm_width)
          + parts.dense(f"{mt}/mlp_0", f"{hf}.{names.fc1}", d.merged, d.merged)
          + parts.dense(f"{mt}/mlp_2", f"{hf}.{names.fc2}", d.merged, d.out_hidden))


def _escape(prefix: str) -> str:
  return prefix.replace(".", r"\.")


def _check(cfg: ModelConfig, v: Mapping[str, Any], kind: Kind, d: Dims) -> None:
  """What MaxText's Qwen tower fixes rather than reads: refused where it would compute something else."""
  problems = []
  if d.hidden % d.heads:
    problems.append(f"vision_config.hidden_size={d.hidden} is not a multiple of num_heads={d.heads}")
  side = math.isqrt(d.positions)
  if side * side != d.positions:
    problems.append(f"vision_config.num_position_embeddings={d.positions} is not a square: MaxText interpolates a"
                    " side x side table")
  if d.out_hidden != cfg.hidden_size:
    problems.append(f"vision_config.out_hidden_size={d.out_hidden} differs from the text hidden_size="
                    f"{cfg.hidden_size}: the mergers' output is added to the decoder's embeddings")
  bad = [i for i in d.deepstack if not 0 <= i < d.depth]
  if bad or len(set(d.deepstack)) != len(d.deepstack):
    problems.append(f"vision_config.deepstack_visual_indexes={list(d.deepstack)}: each must be a distinct block"
                    f" index below depth={d.depth}")
  act = v.get("hidden_act", "gelu_pytorch_tanh")
  if act not in TANH_GELU:
    problems.append(f"vision_config.hidden_act={act!r}: MaxText's vision blocks use the tanh GELU")
  if abs(cfg.rms_norm_eps - LAYER_NORM_EPS) > 1e-12:
    problems.append(f"the text rms_norm_eps={cfg.rms_norm_eps:g} differs from the tower's LayerNorm eps"
                    f" {LAYER_NORM_EPS:g} (fixed by transformers): MaxText uses one normalization_layer_epsilon for"
                    " both")
  for key, expected in (("image_token_id", kind.image_token), ("vision_start_token_id", kind.vision_start_token)):
    token = cfg.get(key, expected)
    if token != expected:
      problems.append(f"{key}={token}: MaxText 0.2.5 hard-codes {expected} for this model")
  parts.refuse_if_any(cfg, "vision tower", problems)
