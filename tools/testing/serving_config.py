"""What vLLM's config loading needs from the config.json the way back writes, checked without vLLM.

`problems(written, original, weights_dtype)` lists, one string each, what would make vLLM reject the written
config.json or read it differently from the original model: each names the field, what vLLM would do, and the vLLM
source that does it. Read from vLLM's main branch (the index's snapshot of vllm-project/vllm, after v0.24.0: the one
that requires transformers >= 5), files
  vllm/transformers_utils/config.py  (commit 0036026e7171)  get_config, HFConfigParser.parse, patch_rope_parameters,
                                     patch_legacy_rope_type, uses_mrope / _mrope_section, get_hf_text_config
  vllm/config/model.py               (commit 18ec66292536)  ModelConfig.__post_init__ / architectures,
                                     _find_dtype, _get_and_verify_dtype, _FLOAT16_NOT_SUPPORTED_MODELS,
                                     _parse_quant_hf_config, _verify_quantization, _get_and_verify_max_len,
                                     get_sliding_window, get_head_size, get_total_num_kv_heads, get_vocab_size
and, since vLLM builds the config through transformers' AutoConfig, transformers 5.24's configuration_utils.py
(`torch_dtype` -> `dtype`, `rope_scaling` -> `rope_parameters`) and modeling_rope_utils.py (standardize_rope_params).

The rules:
  architectures   a non-empty list, the original's. Without it get_config falls back to
                  MODEL_MAPPING_NAMES[model_type], the *base* model class (`LlamaModel`), which vLLM's registry runs
                  as a pooling model, not a generator; a different one resolves another implementation.
  model_type      the original's (HFConfigParser.parse picks the config class by it: _CONFIG_REGISTRY, else
                  AutoConfig). Only renames to what reads the same are allowed (KNOWN_RENAMES).
  dtype           `dtype` (transformers 5) or `torch_dtype` (transformers 4) on the config or its text_config, a
                  torch dtype name, equal to the weights' dtype (for mixed weights, the one they promote to, what
                  vLLM reads from the safetensors headers without it): _find_dtype reads config.dtype, then the
                  text config's, then the headers; `--dtype auto` serves that dtype. transformers 5 keeps
                  `dtype` when both are there, transformers 4 (vLLM < 0.24) reads `torch_dtype` only: both, where
                  both are written, must agree, and a `torch_dtype` the original carried must stay. float16 is
                  refused for gemma2/gemma3/gemma3_text/plamo2/glm4 (_FLOAT16_NOT_SUPPORTED_MODELS).
  quantization    no `quantization_config` nor `compression_config` on the config or its text_config, and no
                  hf_quant_config.json next to it, when the weights are written unquantized: get_config copies
                  quantization_config (or hf_quant_config.json, ModelOpt <= 0.29) onto the config, and
                  _verify_quantization loads the weights with that method (a dequantized checkpoint keeping an fp8
                  quantization_config is loaded as FP8 and fails on the missing scales).
  rope            each rope dict (`rope_parameters` / `rope_scaling`, flat or nested per layer type): no `type`
                  conflicting with `rope_type` and no legacy `mrope` without `mrope_section` (ValueError in
                  patch_legacy_rope_type); yarn / llama3 / longrope with `original_max_position_embeddings`
                  (transformers fills max_position_embeddings in, and _get_and_verify_max_len derives
                  max_model_len = original_max_position_embeddings x factor for yarn); not both `rope_scaling` and
                  `rope_parameters` differing (transformers 5's convert_rope_params_to_dict takes rope_scaling).
  kept fields     the fields vLLM reads (READ_FIELDS: rope, context length, sliding window, attention shape, MLA,
                  experts, vocabulary, tied embeddings), on the config and on its text_config, as the original has
                  them: a dropped `rope_theta` becomes transformers' default theta, a dropped `sliding_window` or
                  `layer_types` turns sliding attention into full attention, a dropped max length key becomes 2048.
  text_config     kept where the original has one, with `num_attention_heads` (get_hf_text_config raises without).
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

# What the config.json names a dtype (transformers does getattr(torch, name)); vLLM's --dtype names.
TORCH_DTYPES = ("float32", "bfloat16", "float16")
# vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS.
FLOAT16_NOT_SUPPORTED = ("gemma2", "gemma3", "gemma3_text", "plamo2", "glm4")
QUANTIZATION_FIELDS = ("quantization_config", "compression_config")
QUANTIZATION_FILES = ("hf_quant_config.json",)
# model_type renames that vLLM reads as the original: its _CONFIG_REGISTRY maps kimi_k2 to DeepseekV3Config.
KNOWN_RENAMES = frozenset({("kimi_k2", "deepseek_v3")})
ROPE_DICTS = ("rope_parameters", "rope_scaling")
# rope types whose scaling starts at the pretraining length (transformers' standardize_rope_params).
ROPE_WITH_ORIGINAL_LENGTH = ("yarn", "llama3", "longrope")

_MODEL = "vllm/config/model.py"
_CONFIG = "vllm/transformers_utils/config.py"
# Field -> why vLLM needs it as the original has it. On the config and on its text_config (hf_text_config).
READ_FIELDS: dict[str, str] = {
    **{k: f"RoPE: {_CONFIG} patch_rope_parameters / transformers' convert_rope_params_to_dict (a missing theta"
          " becomes the config class's default)"
       for k in ("rope_parameters", "rope_scaling", "rope_theta", "rotary_emb_base", "partial_rotary_factor",
                 "rotary_pct", "rotary_emb_fraction", "rope_local_base_freq", "original_max_position_embeddings",
                 "mrope_section", "xdrope_section")},
    **{k: f"context length: {_MODEL} _get_and_verify_max_len (possible_keys; none -> 2048)"
       for k in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                 "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")},
    **{k: f"sliding window: {_MODEL} get_sliding_window / attention_chunk_size and the model's layer types"
       for k in ("sliding_window", "layer_types", "use_sliding_window", "max_window_layers",
                 "sliding_window_pattern", "attention_chunk_size")},
    **{k: f"attention shape: {_MODEL} get_head_size / get_total_num_kv_heads / is_deepseek_mla"
       for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers",
                 "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")},
    **{k: f"experts: {_MODEL} get_num_experts / is_model_moe"
       for k in ("num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok",
                 "moe_intermediate_size", "n_shared_experts")},
    "vocab_size": f"vocabulary: {_MODEL} get_vocab_size (the embedding's rows)",
    "tie_word_embeddings": "tied embeddings: the model loads lm_head from embed_tokens when set",
}


_SAFETENSORS_FLOATS = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}
_WIDTH = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def weights_dtype(dtypes: Iterable[str]) -> str | None:
  """The dtype vLLM infers from the safetensors headers' `dtypes` (safetensors codes, `BF16`, or names,
  `bfloat16`), and so the one config.json must name: the floating ones promoted to one (vllm/utils/torch_utils.py
  common_broadcastable_dtype, as _find_dtype uses it; float16 with bfloat16 gives float32). None without floats."""
  names = {_SAFETENSORS_FLOATS.get(d, d) for d in dtypes} & set(_WIDTH)
  if not names:
    return None
  widest = max(names, key=_WIDTH.get)
  return "float32" if _WIDTH[widest] == 2 and len(names) == 2 else widest


def _text_config(config: dict[str, Any]) -> dict[str, Any] | None:
  text = config.get("text_config")
  return text if isinstance(text, dict) else None


def _levels(config: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
  """("", the config) and ("text_config.", its text config) where there is one: where vLLM reads."""
  yield "", config
  text = _text_config(config)
  if text is not None:
    yield "text_config.", text


def _rope_dicts(config: dict[str, Any], prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
  """Each rope parameter dict, named by its path: a flat one, or one per layer type when nested."""
  for key in ROPE_DICTS:
    value = config.get(key)
    if not isinstance(value, dict) or not value:
      continue
    if all(isinstance(v, dict) or v is None for v in value.values()):  # Nested by layer type (Gemma 3).
      for layer_type, params in value.items():
        if isinstance(params, dict):
          yield f"{prefix}{key}.{layer_type}", params
    else:
      yield f"{prefix}{key}", value


def _dtype_problems(written: dict[str, Any], original: dict[str, Any], weights_dtype: str) -> list[str]:
  problems = []
  found = False
  for prefix, config in _levels(written):
    for key in ("dtype", "torch_dtype"):
      value = config.get(key)
      if value is None:
        continue
      found = True
      if value not in TORCH_DTYPES:
        problems.append(f"{prefix}{key}: {value!r} is not a torch dtype name (transformers does getattr(torch,"
                        f" {key}); {_MODEL} _find_dtype)")
      elif value != weights_dtype:
        problems.append(f"{prefix}{key}: {value!r} but the weights are {weights_dtype}: vLLM's --dtype auto serves"
                        f" {value} ({_MODEL} _find_dtype / _get_and_verify_dtype)")
    if config.get("dtype") is not None and config.get("torch_dtype") is not None and (
        config["dtype"] != config["torch_dtype"]):
      problems.append(f"{prefix}torch_dtype: {config['torch_dtype']!r} against dtype {config['dtype']!r}:"
                      " transformers 5 reads `dtype`, transformers 4 (vLLM < 0.24) `torch_dtype`")
  if not found:
    problems.append(f"dtype: neither `dtype` nor `torch_dtype` on the config or its text_config: vLLM falls back to"
                    f" the safetensors headers, then float32 ({_MODEL} _find_dtype)")
  for prefix, config in _levels(original):
    target = written if not prefix else (_text_config(written) or {})
    if config.get("torch_dtype") is not None and target.get("torch_dtype") is None:
      problems.append(f"{prefix}torch_dtype: the original carries it and the written config does not: transformers"
                      " 4 (what vLLM < 0.24 runs on) reads no other dtype key")
  model_type = written.get("model_type")
  text_type = (_text_config(written) or {}).get("model_type")
  if weights_dtype == "float16" and (model_type in FLOAT16_NOT_SUPPORTED or text_type in FLOAT16_NOT_SUPPORTED):
    problems.append(f"dtype: float16 for model_type {model_type!r}: vLLM refuses --dtype float16 and serves"
                    f" --dtype auto in bfloat16 ({_MODEL} _FLOAT16_NOT_SUPPORTED_MODELS)")
  return problems


def _rope_problems(written: dict[str, Any]) -> list[str]:
  problems = []
  for prefix, config in _levels(written):
    both = [config.get(k) for k in ROPE_DICTS]
    if all(isinstance(v, dict) for v in both) and both[0] != both[1]:
      problems.append(f"{prefix}rope_scaling: differs from {prefix}rope_parameters and transformers 5 reads"
                      " rope_scaling first (convert_rope_params_to_dict)")
    for path, params in _rope_dicts(config, prefix):
      rope_type, legacy = params.get("rope_type"), params.get("type")
      if rope_type is not None and legacy is not None and rope_type != legacy and (legacy, rope_type) not in (
          ("su", "longrope"), ("mrope", "default")):
        problems.append(f"{path}: rope_type {rope_type!r} conflicts with the legacy type {legacy!r}"
                        f" (ValueError in {_CONFIG} patch_legacy_rope_type)")
      kind = rope_type if rope_type is not None else legacy
      if kind == "mrope" and "mrope_section" not in params:
        problems.append(f"{path}: legacy rope type 'mrope' without mrope_section"
                        f" (ValueError in {_CONFIG} patch_legacy_rope_type)")
      if kind in ROPE_WITH_ORIGINAL_LENGTH and "original_max_position_embeddings" not in params and (
          "original_max_position_embeddings" not in config):
        problems.append(f"{path}: {kind} RoPE without original_max_position_embeddings: transformers fills in"
                        " max_position_embeddings, and vLLM's max_model_len (for yarn: that x factor) and the"
                        f" scaling change ({_MODEL} _get_and_verify_max_len)")
  return problems


def _kept_problems(written: dict[str, Any], original: dict[str, Any], vocab_size: int | None) -> list[str]:
  problems = []
  for prefix, config in _levels(original):
    target = written if not prefix else _text_config(written)
    if target is None:
      problems.append(f"text_config: the original has one and the written config does not: vLLM reads the text"
                      f" model's fields from it ({_CONFIG} get_hf_text_config)")
      continue
    for key, why in READ_FIELDS.items():
      if key == "vocab_size" and vocab_size is not None:
        continue
      if key in config and (key not in target or target[key] != config[key]):
        now = f"{target[key]!r}" if key in target else "missing"
        problems.append(f"{prefix}{key}: {now}, the original's is {config[key]!r}; {why}")
  text = _text_config(written)
  if text is not None and "num_attention_heads" not in text and _text_config(original) is not None and (
      "num_attention_heads" in _text_config(original)):
    problems.append(f"text_config.num_attention_heads: missing (ValueError in {_CONFIG} get_hf_text_config)")
  if vocab_size is not None:
    prefix, config = list(_levels(written))[-1]
    if config.get("vocab_size") != vocab_size:
      problems.append(f"{prefix}vocab_size: {config.get('vocab_size')!r} but the embedding has {vocab_size} rows"
                      f" ({_MODEL} get_vocab_size)")
  return problems


def problems(written: dict[str, Any], original: dict[str, Any], weights_dtype: str, *,
             weights_quantized: bool = False, files: Iterable[str] = (), vocab_size: int | None = None) -> list[str]:
  """What would make vLLM reject `written` (a config.json the way back wrote) or read it differently from
  `original` (the model's config.json), for weights written in `weights_dtype` (a numpy / torch dtype name; for
  weights of several dtypes, `weights_dtype(...)` of them: what vLLM reads from the headers).

  `weights_quantized`: whether the written weights are quantized (the way back writes them dequantized). `files`:
  the names of the other files in the output directory. `vocab_size`: the written embedding's rows, where the
  conversion changed the vocabulary. Returns one string per problem, naming the field; empty when vLLM reads it as
  the original."""
  found: list[str] = []
  architectures = written.get("architectures")
  if not (isinstance(architectures, list) and architectures and all(isinstance(a, str) for a in architectures)):
    found.append(f"architectures: {architectures!r}, not a non-empty list of class names: vLLM takes the base model"
                 f" class of model_type (MODEL_MAPPING_NAMES), run as a pooling model ({_CONFIG} get_config;"
                 f" {_MODEL} ModelConfig.architectures -> registry)")
  elif "architectures" in original and architectures != original["architectures"]:
    found.append(f"architectures: {architectures!r}, the original's is {original['architectures']!r}: vLLM's"
                 f" registry resolves another implementation ({_MODEL} registry.inspect_model_cls)")
  model_type = written.get("model_type")
  if not isinstance(model_type, str) or not model_type:
    found.append(f"model_type: {model_type!r}: transformers' AutoConfig cannot pick a config class"
                 f" ({_CONFIG} HFConfigParser.parse)")
  elif "model_type" in original and model_type != original["model_type"] and (
      (original["model_type"], model_type) not in KNOWN_RENAMES):
    found.append(f"model_type: {model_type!r}, the original's is {original['model_type']!r}: another config class"
                 f" ({_CONFIG} HFConfigParser.parse)")
  found += _dtype_problems(written, original, weights_dtype)
  if not weights_quantized:
    for prefix, config in _levels(written):
      for key in QUANTIZATION_FIELDS:
        if config.get(key) is not None:
          found.append(f"{prefix}{key}: kept while the weights are written unquantized: vLLM loads them with its"
                       f" quant_method ({_CONFIG} get_config; {_MODEL} _parse_quant_hf_config /"
                       " _verify_quantization)")
    for name in files:
      if name in QUANTIZATION_FILES:
        found.append(f"{name}: next to config.json while the weights are unquantized: vLLM reads it as the"
                     f" quantization_config ({_CONFIG} get_config, ModelOpt <= 0.29)")
  found += _rope_problems(written)
  found += _kept_problems(written, original, vocab_size)
  return found
