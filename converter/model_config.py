"""The dimensions of a HuggingFace decoder, read from its `config.json` and nothing else."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Iterable, Iterator, Mapping

from converter import json_input, storage
from converter.arrays import Shape
from converter.errors import ConversionError

# config.json keys that count something a conversion builds one of each of (layers, experts, a tower's blocks), at
# any depth: `num_hidden_layers`, `vision_config.depth`, `n_routed_experts`, DeepSeek's `first_k_dense_replace`.
_COUNT_KEY = re.compile(r".*(layers|experts)|depth$|first_k_dense_replace$")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """What the conversion needs to know about a checkpoint. `raw` keeps every other key for family files."""

  path: str
  architecture: str
  model_type: str
  hidden_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  intermediate_size: int
  vocab_size: int
  rms_norm_eps: float
  rope_theta: float
  tie_word_embeddings: bool
  raw: Mapping[str, Any]

  def get(self, key: str, default: Any = None) -> Any:
    return self.raw.get(key, default)

  def require(self, key: str) -> Any:
    if key not in self.raw or self.raw[key] is None:
      raise ConversionError(f"{self.path}: missing required key {key!r} for {self.architecture}")
    return self.raw[key]


def _positive_int(raw: Mapping[str, Any], key: str, path: str, default: Any = None) -> int:
  value = raw.get(key, default)
  if value is None:
    raise ConversionError(f"{path}: missing required key {key!r}")
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise ConversionError(f"{path}: {key!r} must be a positive integer, got {value!r}")
  return value


def _number(value: Any, key: str, path: str) -> float:
  """A float from config.json, or a ConversionError naming the key (null and strings included)."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ConversionError(f"{path}: {key!r} must be a number, got {value!r}")
  return float(value)


def _rope_theta(raw: Mapping[str, Any], path: str) -> float:
  if raw.get("rope_theta") is not None:
    return _number(raw["rope_theta"], "rope_theta", path)
  rope_parameters = raw.get("rope_parameters") or {}
  # transformers 5 nests per-attention-type settings for models with local and global layers (Gemma3).
  rope_parameters = rope_parameters.get("full_attention", rope_parameters)
  return _number(rope_parameters.get("rope_theta", 10000.0), "rope_parameters.rope_theta", path)


def load_model_config(model_dir: str) -> ModelConfig:
  """Parses `config.json` in `model_dir`; raises ConversionError naming the file and key on any problem."""
  path = storage.join(model_dir, "config.json")
  try:
    raw = json_input.read(path, "malformed config.json")
  except FileNotFoundError as e:
    raise ConversionError(f"{path}: missing (a HuggingFace checkpoint directory needs its config.json)") from e
  return parse_model_config(raw, path)


def parse_model_config(raw: Any, path: str) -> ModelConfig:
  """A config.json dict, read from `path` (errors name it); raises ConversionError naming the key on any problem."""
  if not isinstance(raw, dict):
    raise ConversionError(f"{path}: malformed config.json (not a JSON object)")
  architectures = raw.get("architectures")
  if not isinstance(architectures, list) or not architectures or not isinstance(architectures[0], str):
    raise ConversionError(f"{path}: missing 'architectures' (e.g. [\"Qwen3ForCausalLM\"])")
  merged = dict(raw)
  # A multimodal config nests the text decoder's dims (`text_config`), Qwen3-Omni one level deeper
  # (`thinker_config.text_config`): the nested keys win, the outer ones (`vision_config`, ...) stay readable.
  for key in ("thinker_config", "text_config"):
    if isinstance(merged.get(key), dict):
      merged = {**merged, **merged[key]}
  # transformers ties the embeddings by the outermost config's key (Qwen3-VL-MoE: false at the top, while its
  # text_config keeps the default true).
  if "tie_word_embeddings" in raw:
    merged["tie_word_embeddings"] = raw["tie_word_embeddings"]
  hidden = _positive_int(merged, "hidden_size", path)
  heads = _positive_int(merged, "num_attention_heads", path)
  head_dim = merged.get("head_dim")
  latent = [merged.get(k) for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim")]
  if head_dim is None and all(latent):
    # Multi-head latent attention sizes its heads itself (DeepSeek V2/V3, Kimi K2): a query or key head is its
    # unrotated part plus its rotated part, whatever hidden_size / heads is.
    head_dim = _positive_int(merged, "qk_nope_head_dim", path) + _positive_int(merged, "qk_rope_head_dim", path)
  if head_dim is None:
    if hidden % heads:
      raise ConversionError(f"{path}: no 'head_dim' and hidden_size {hidden} is not divisible by {heads} heads")
    head_dim = hidden // heads
  kv_heads = _positive_int(merged, "num_key_value_heads", path, default=heads)
  if heads % kv_heads:
    raise ConversionError(f"{path}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
  return ModelConfig(
      path=path,
      architecture=architectures[0],
      model_type=str(merged.get("model_type", "")),
      hidden_size=hidden,
      num_layers=_positive_int(merged, "num_hidden_layers", path),
      num_heads=heads,
      num_kv_heads=kv_heads,
      head_dim=_positive_int({"head_dim": head_dim}, "head_dim", path),
      intermediate_size=_positive_int(merged, "intermediate_size", path, default=1),
      vocab_size=_positive_int(merged, "vocab_size", path),
      rms_norm_eps=_number(merged.get("rms_norm_eps", 1e-6), "rms_norm_eps", path),
      rope_theta=_rope_theta(merged, path),
      tie_word_embeddings=bool(merged.get("tie_word_embeddings", False)),
      raw=merged,
  )


def _claimed_counts(raw: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, int]]:
  """(dotted key, value) of every integer under a counting key (`_COUNT_KEY`) in `raw` and the objects in it."""
  for key, value in raw.items():
    if isinstance(value, dict):
      yield from _claimed_counts(value, f"{prefix}{key}.")
    elif isinstance(value, int) and not isinstance(value, bool) and _COUNT_KEY.match(key):
      yield f"{prefix}{key}", value


def check_claimed_counts(config: ModelConfig, shapes: Iterable[Shape], holder: str) -> None:
  """Refuses a config.json whose layer, expert or block counts exceed what the checkpoint `holder` (whose tensors
  or leaves have `shapes`) can hold, before anything is built per layer or per expert: each needs a tensor of its
  own or a position along some tensor's axis, so no count exceeds the larger of the number of tensors and the
  longest axis of a non-empty one. What a plan allocates per layer then stays in proportion to what the files
  hold, whatever config.json claims."""
  shapes = list(shapes)
  longest = max((max(shape) for shape in shapes if shape and math.prod(shape)), default=0)
  bound = max(len(shapes), longest)
  for key, value in _claimed_counts(config.raw):
    if value > bound:
      raise ConversionError(
          f"{config.path}: {key} is {value:,}, more than {holder} can hold ({len(shapes):,} tensors, the longest"
          f" axis {longest:,}; each layer or expert needs a tensor of its own or a position along one)")
