"""A PEFT LoRA adapter for the bundled tiny Qwen3, written without peft or torch: random factors for every
layer's query and down projections (unit tests of the LoRA paths)."""

from __future__ import annotations

import json
import os

import numpy as np

from converter.sources import lora
from tools.make_tiny_checkpoint import TINY_QWEN3_CONFIG
from tools.safetensors_writer import write_safetensors

R, ALPHA = 4, 8
E, HEADS, D, M, LAYERS = (TINY_QWEN3_CONFIG[k] for k in ("hidden_size", "num_attention_heads", "head_dim",
                                                          "intermediate_size", "num_hidden_layers"))


def write_adapter(directory: str, config: dict | None = None) -> lora.LoraAdapter:
  """The adapter in `directory` (r R, lora_alpha ALPHA, `config` added to its adapter_config.json), read back."""
  rng = np.random.default_rng(0)
  tensors = {}
  for layer in range(LAYERS):
    for module, (out_dim, in_dim) in (("self_attn.q_proj", (HEADS * D, E)), ("mlp.down_proj", (E, M))):
      prefix = f"base_model.model.model.layers.{layer}.{module}"
      tensors[f"{prefix}.lora_A.weight"] = rng.standard_normal((R, in_dim)).astype(np.float32)
      tensors[f"{prefix}.lora_B.weight"] = rng.standard_normal((out_dim, R)).astype(np.float32)
  write_safetensors(os.path.join(directory, lora.ADAPTER_WEIGHTS), tensors)
  with open(os.path.join(directory, lora.ADAPTER_CONFIG), "w") as f:
    json.dump({"peft_type": "LORA", "r": R, "lora_alpha": ALPHA, **(config or {})}, f)
  return lora.read_adapter(directory)
