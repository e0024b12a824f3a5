"""Pieces the tower modules share: dense layers, norms and multi-head attention projections, HF (out, in) weights
to MaxText (in, out) kernels, one `Param` each."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from converter import ops
from converter.errors import ConversionError
from converter.families.base import Param
from converter.model_config import ModelConfig


def sub_config(cfg: ModelConfig, key: str) -> Mapping[str, Any]:
  """config.json's `vision_config` / `audio_config` (Qwen3-Omni: under `thinker_config`, merged by ModelConfig)."""
  value = cfg.get(key)
  if not isinstance(value, dict):
    raise ConversionError(f"{cfg.path}: {cfg.architecture} needs {key!r} (an object) to convert its tower")
  return value


def refuse_if_any(cfg: ModelConfig, tower: str, problems: list[str]) -> None:
  """Refuses a tower config MaxText would run differently from transformers, naming every problem found (each
  tower's check collects them all, so that one message lists what to change)."""
  if problems:
    raise ConversionError(f"{cfg.path}: the {tower} cannot run in MaxText as in transformers: "
                          + "; ".join(problems) + " (--text_only converts the text decoder alone)")


def require(cfg: ModelConfig, sub: Mapping[str, Any], section: str, key: str, default: Any = None) -> Any:
  value = sub.get(key, default)
  if value is None:
    raise ConversionError(f"{cfg.path}: missing required key {section}.{key} for {cfg.architecture}'s tower")
  return value


@dataclasses.dataclass(frozen=True)
class Section:
  """One tower's section of config.json (`vision_config`, ...): `section(key)` reads a required key, and errors
  name the file, the section and the key."""

  cfg: ModelConfig
  name: str
  values: Mapping[str, Any]

  @classmethod
  def of(cls, cfg: ModelConfig, name: str) -> Section:
    return cls(cfg, name, sub_config(cfg, name))

  def __call__(self, key: str, default: Any = None) -> Any:
    return require(self.cfg, self.values, self.name, key, default)

  def encoder(self) -> tuple[int, int, int, int]:
    """A ViT-style encoder's (hidden size, attention heads, MLP width, layers)."""
    return (int(self("hidden_size")), int(self("num_attention_heads")), int(self("intermediate_size")),
            int(self("num_hidden_layers")))


def dense(mt: str, hf: str, fan_in: int, fan_out: int, *, bias: bool = True) -> tuple[Param, ...]:
  """`hf`.weight (out, in) -> `mt`/kernel (in, out), `hf`.bias -> `mt`/bias."""
  params = (Param(f"{mt}/kernel", f"{hf}.weight", (fan_out, fan_in), (ops.Transpose(),)),)
  return params + ((Param(f"{mt}/bias", f"{hf}.bias", (fan_out,)),) if bias else ())


def norm(mt: str, hf: str, size: int, *, bias: bool = True, offset: float = 0.0) -> tuple[Param, ...]:
  """A LayerNorm (scale and bias) or RMSNorm (scale; `offset` added where HF applies 1 + w)."""
  scale_ops = (ops.AddInFloat32(offset),) if offset else ()
  params = (Param(f"{mt}/scale", f"{hf}.weight", (size,), scale_ops),)
  return params + ((Param(f"{mt}/bias", f"{hf}.bias", (size,)),) if bias else ())


def heads_projection(mt: str, hf: str, hidden: int, heads: int, *, bias: bool = True,
                     weight: str = "weight") -> tuple[Param, ...]:
  """A q/k/v projection (H*D, E) -> kernel (E, H, D), bias (H*D,) -> (H, D)."""
  head_dim = hidden // heads
  params = (Param(f"{mt}/kernel", f"{hf}.{weight}", (heads * head_dim, hidden),
                  ops.to_heads_kernel(hidden, heads, head_dim)),)
  if bias:
    params += (Param(f"{mt}/bias", f"{hf}.bias", (heads * head_dim,), ops.to_heads_bias(heads, head_dim)),)
  return params


def out_projection(mt: str, hf: str, hidden: int, heads: int, *, bias: bool = True,
                   weight: str = "weight") -> tuple[Param, ...]:
  """An output projection (E, H*D) -> kernel (H, D, E), bias (E,)."""
  head_dim = hidden // heads
  params = (Param(f"{mt}/kernel", f"{hf}.{weight}", (hidden, heads * head_dim),
                  ops.to_out_kernel(hidden, heads, head_dim)),)
  return params + ((Param(f"{mt}/bias", f"{hf}.bias", (hidden,)),) if bias else ())


def attention(mt: str, hf: str, hidden: int, heads: int, names: tuple[str, str, str, str], *,
              bias: bool = True) -> tuple[Param, ...]:
  """Separate q, k, v and output projections; `names` are HF's (e.g. q_proj, k_proj, v_proj, out_proj)."""
  if hidden % heads:
    raise ConversionError(f"tower attention {hf}: hidden size {hidden} is not a multiple of {heads} heads")
  q, k, v, o = names
  return (heads_projection(f"{mt}/query", f"{hf}.{q}", hidden, heads, bias=bias)
          + heads_projection(f"{mt}/key", f"{hf}.{k}", hidden, heads, bias=bias)
          + heads_projection(f"{mt}/value", f"{hf}.{v}", hidden, heads, bias=bias)
          + out_projection(f"{mt}/out", f"{hf}.{o}", hidden, heads, bias=bias))
