"""Weaver checkpoints for tests: a Qwen3-VL `save_pretrained` directory rewritten as Weaver's, and a Weaver
checkpoint rewritten as the Qwen3-VL transformers runs (test-only: imports torch).

transformers 5.24 has no Weaver class. MaxText 0.2.5 reads Weaver as Qwen3-VL under other names
(checkpoint_conversion/utils/param_mapping.py, WEAVER_MAXTEXT_TO_HF_PARAM_MAPPING): no `model.language_model.` or
`model.visual.` prefix, the text attention's `to_q/to_k/to_v/to_out` and `norm_q/norm_k`; config.json as
hf_model_configs.py's weaver_mini_dict (architecture `WeaverOmniForConditionalGeneration`, model_type `weaver_omni`,
Qwen3-VL's `text_config` and `vision_config`). So the tiny `weaver` row is a Qwen3-VL model saved and rewritten
(`to_weaver`), and its reference logits are that Qwen3-VL's (`as_qwen3_vl`). Written from MaxText's mapping,
independently of converter/families/weaver.py.
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Any, Callable

ARCHITECTURE = "WeaverOmniForConditionalGeneration"
MODEL_TYPE = "weaver_omni"
QWEN3_VL_ARCHITECTURE = "Qwen3VLForConditionalGeneration"
_ATTENTION = (("q_proj", "to_q"), ("k_proj", "to_k"), ("v_proj", "to_v"), ("o_proj", "to_out"), ("q_norm", "norm_q"),
              ("k_norm", "norm_k"))
_VISION = re.compile(r"^(patch_embed|pos_embed|blocks|merger|deepstack_merger_list)\.")
_INDEX = "model.safetensors.index.json"


def is_weaver(directory: str) -> bool:
  with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
    return json.load(f).get("model_type") == MODEL_TYPE


def weaver_config(config: dict[str, Any]) -> dict[str, Any]:
  """A Qwen3-VL config.json -> Weaver's: the same keys under Weaver's architecture and model type."""
  return dict(config, architectures=[ARCHITECTURE], model_type=MODEL_TYPE)


def weaver_name(name: str) -> str:
  """transformers' Qwen3-VL name -> Weaver's."""
  name = re.sub(r"^model\.(language_model|visual)\.", "", name)
  for qwen, weaver in _ATTENTION:
    name = name.replace(f".self_attn.{qwen}.", f".self_attn.{weaver}.")
  return name


def qwen3_vl_name(name: str) -> str:
  """Weaver's name -> transformers' Qwen3-VL name."""
  if name.startswith("lm_head."):
    return name
  if _VISION.match(name):
    return "model.visual." + name
  for qwen, weaver in _ATTENTION:
    name = name.replace(f".self_attn.{weaver}.", f".self_attn.{qwen}.")
  return "model.language_model." + name


def to_weaver(directory: str) -> None:
  """Rewrites a Qwen3-VL `save_pretrained` directory in place as a Weaver checkpoint."""
  _rewrite(directory, directory, weaver_name, weaver_config)


def as_qwen3_vl(directory: str, output_dir: str) -> str:
  """Writes the Weaver checkpoint in `directory` to `output_dir` as the Qwen3-VL transformers loads; returns it."""
  return _rewrite(directory, output_dir, qwen3_vl_name,
                  lambda config: dict(config, architectures=[QWEN3_VL_ARCHITECTURE], model_type="qwen3_vl"))


def _rewrite(directory: str, output_dir: str, rename: Callable[[str], str],
             change_config: Callable[[dict[str, Any]], dict[str, Any]]) -> str:
  """Every shard's tensors renamed (dtypes kept: torch reads bfloat16), the index's names too, and config.json."""
  from safetensors.torch import load_file, save_file  # pylint: disable=g-import-not-at-top

  os.makedirs(output_dir, exist_ok=True)
  for path in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
    tensors = {rename(name): tensor for name, tensor in load_file(path).items()}
    save_file(tensors, os.path.join(output_dir, os.path.basename(path)), metadata={"format": "pt"})
  if os.path.exists(os.path.join(directory, _INDEX)):
    with open(os.path.join(directory, _INDEX), encoding="utf-8") as f:
      index = json.load(f)
    index["weight_map"] = {rename(name): shard for name, shard in index["weight_map"].items()}
    with open(os.path.join(output_dir, _INDEX), "w", encoding="utf-8") as f:
      json.dump(index, f, indent=2, sort_keys=True)
  with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
    config = change_config(json.load(f))
  with open(os.path.join(output_dir, "config.json"), "w", encoding="utf-8") as f:
    json.dump(config, f, indent=2, sort_keys=True)
  return output_dir
