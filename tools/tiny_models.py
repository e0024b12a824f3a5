"""Random tiny HF models for tests and validation, built with transformers (test-only: imports torch).

Every parameter is drawn at random, norm scales included: transformers initialises norms to 1 (or 0 for
Gemma's `1 + w`), which would let a converter that drops or misplaces a norm pass every logits check.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class TinyModelSpec:
  config_class: str  # A transformers config class name.
  model_class: str
  config: dict[str, Any]


def _qwen3() -> TinyModelSpec:
  return TinyModelSpec(
      "Qwen3Config",
      "Qwen3ForCausalLM",
      dict(hidden_size=256, num_hidden_layers=8, vocab_size=512, num_attention_heads=4, num_key_value_heads=2,
           head_dim=96, intermediate_size=512, rope_theta=1e6, max_position_embeddings=512, rms_norm_eps=1e-6,
           tie_word_embeddings=False),
  )


# Shared shape of the tiny models: head_dim differs from hidden / heads, queries are grouped 3:1.
_DENSE = dict(hidden_size=192, num_hidden_layers=4, vocab_size=509, num_attention_heads=6, num_key_value_heads=2,
              head_dim=40, intermediate_size=320, max_position_embeddings=512, rms_norm_eps=1e-5,
              tie_word_embeddings=False)
_LLAMA31_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192, "rope_theta": 500000.0}


def _llama2() -> TinyModelSpec:
  return TinyModelSpec("LlamaConfig", "LlamaForCausalLM", dict(_DENSE, rope_theta=10000.0))


def _llama3() -> TinyModelSpec:
  return TinyModelSpec("LlamaConfig", "LlamaForCausalLM", dict(_DENSE, rope_theta=500000.0))


def _llama31() -> TinyModelSpec:
  return TinyModelSpec("LlamaConfig", "LlamaForCausalLM",
                       dict(_DENSE, rope_parameters=_LLAMA31_SCALING, max_position_embeddings=131072))


def _llama32_tied() -> TinyModelSpec:
  return TinyModelSpec("LlamaConfig", "LlamaForCausalLM",
                       dict(_DENSE, rope_parameters=_LLAMA31_SCALING, max_position_embeddings=131072,
                            tie_word_embeddings=True))


def _mistral() -> TinyModelSpec:
  return TinyModelSpec("MistralConfig", "MistralForCausalLM", dict(_DENSE, rope_theta=1e6, sliding_window=None))


def _qwen2() -> TinyModelSpec:
  return TinyModelSpec("Qwen2Config", "Qwen2ForCausalLM", dict(_DENSE, rope_theta=1e6))


def _qwen3_moe() -> TinyModelSpec:
  return TinyModelSpec(
      "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
      dict(_DENSE, rope_theta=1e6, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=96,
           norm_topk_prob=True),
  )


def _qwen3_30b_a3b_tiny() -> TinyModelSpec:
  """Qwen3-30B-A3B's structure at reduced size: 48 -> 4 layers, 128 -> 8 experts (top 8 -> top 2), hidden 2048 ->
  128, 32 -> 8 query and 4 -> 2 KV heads of head_dim 128 -> 32 (so H*D = 2 * hidden, as in the original),
  moe_intermediate 768 -> 48, vocab 151936 -> 512; norm_topk_prob true, every layer sparse, untied."""
  return TinyModelSpec(
      "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
      dict(hidden_size=128, num_hidden_layers=4, vocab_size=512, num_attention_heads=8, num_key_value_heads=2,
           head_dim=32, intermediate_size=384, moe_intermediate_size=48, num_experts=8, num_experts_per_tok=2,
           norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], rope_theta=1e6,
           max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False),
  )


def _mixtral() -> TinyModelSpec:
  return TinyModelSpec(
      "MixtralConfig", "MixtralForCausalLM",
      dict(_DENSE, rope_theta=1e6, num_local_experts=4, num_experts_per_tok=2, intermediate_size=96),
  )


# Gemma: tied embeddings, E=256 (sqrt(E)=16 exact), head_dim 48 != hidden/heads 64, rms_norm_eps 1e-6 (MaxText's
# gemma layer norms fix it); sliding window 8 < the 32-token test sequences; soft caps small enough to bend.
_GEMMA = dict(hidden_size=256, vocab_size=509, num_attention_heads=4, num_key_value_heads=2, head_dim=48,
              intermediate_size=320, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True)


def _gemma() -> TinyModelSpec:
  return TinyModelSpec("GemmaConfig", "GemmaForCausalLM",
                       dict(_GEMMA, num_hidden_layers=3, num_key_value_heads=1, hidden_act="gelu_pytorch_tanh"))


def _gemma2() -> TinyModelSpec:
  """4 HF layers (2 MaxText layers); query_pre_attn_scalar = hidden/heads != head_dim, as in Gemma-2-27B."""
  return TinyModelSpec("Gemma2Config", "Gemma2ForCausalLM",
                       dict(_GEMMA, num_hidden_layers=4, query_pre_attn_scalar=64, sliding_window=8,
                            attn_logit_softcapping=2.0, final_logit_softcapping=10.0, rope_theta=10000.0))


def _gemma3() -> TinyModelSpec:
  """8 layers: one scanned block of 6 (layer 5 global) plus 2 remainder layers; local and global rope bases,
  linear scaling 8 on global layers (as Gemma-3-4B); query_pre_attn_scalar = head_dim (gemma3-4b's rule).
  attn_logit_softcapping is set although transformers' Gemma3 ignores it: the conversion must ignore it too."""
  rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
  return TinyModelSpec("Gemma3TextConfig", "Gemma3ForCausalLM",
                       dict(_GEMMA, num_hidden_layers=8, query_pre_attn_scalar=48, sliding_window=8,
                            attn_logit_softcapping=1.5, final_logit_softcapping=10.0, rope_parameters=rope))


TINY_MODELS: dict[str, Callable[[], TinyModelSpec]] = {
    "qwen3": _qwen3,
    "llama2": _llama2,
    "llama3": _llama3,
    "llama3.1": _llama31,
    "llama3.2_tied": _llama32_tied,
    "mistral": _mistral,
    "qwen2": _qwen2,
    "qwen3_moe": _qwen3_moe,
    "mixtral": _mixtral,
    "qwen3_30b_a3b_tiny": _qwen3_30b_a3b_tiny,
    "gemma": _gemma,
    "gemma2": _gemma2,
    "gemma3": _gemma3,
}


def randomize_parameters(model: Any, seed: int) -> None:
  """Weights ~ N(0, 0.05^2); 1-D norm scales ~ 1 + N(0, 0.2^2)."""
  import torch  # pylint: disable=g-import-not-at-top

  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, param in sorted(model.named_parameters()):
      noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
      if param.ndim == 1 and "norm" in name:
        param.copy_(1.0 + 0.2 * noise)
      else:
        param.copy_(0.05 * noise)


def build_tiny_model(
    family: str, output_dir: str, *, dtype: str = "float32", seed: int = 0, max_shard_size: str | None = None,
    round_embeddings_to_bf16: bool = False, **config_overrides: Any,
) -> str:
  """Writes a random tiny `family` model (config.json + safetensors) to `output_dir`; returns it.

  `round_embeddings_to_bf16` rounds the input and output embedding tables to bfloat16-representable values
  (still saved in `dtype`): MaxText computes tied logits with a bfloat16 copy of the table whatever its dtype."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  spec = TINY_MODELS[family]()
  config = getattr(transformers, spec.config_class)(**{**spec.config, **config_overrides})
  torch.manual_seed(seed)
  model = getattr(transformers, spec.model_class)(config).to(torch.float32)
  randomize_parameters(model, seed)
  if round_embeddings_to_bf16:
    with torch.no_grad():
      for table in (model.get_input_embeddings(), model.get_output_embeddings()):
        if table is not None:
          table.weight.copy_(table.weight.to(torch.bfloat16).to(torch.float32))
  model = model.to(getattr(torch, dtype))
  kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
  model.save_pretrained(output_dir, **kwargs)
  return output_dir
