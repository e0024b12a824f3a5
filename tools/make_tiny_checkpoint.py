"""Generates the bundled tiny Qwen3 checkpoint (testdata/tiny-qwen3) deterministically, with numpy only.

  bazel run //tools:make_tiny_checkpoint -- --output_dir=testdata/tiny-qwen3

Every parameter is random, norm scales included (all-ones norms would hide a wrong norm mapping), and head_dim
differs from hidden_size / num_attention_heads so a converter that derives it gets caught.
"""

from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np
from absl import app, flags

from tools.safetensors_writer import write_safetensors

FLAGS = flags.FLAGS
flags.DEFINE_string("output_dir", "testdata/tiny-qwen3", "Where to write config.json and model.safetensors.")

TINY_QWEN3_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 24,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "vocab_size": 257,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 512,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def tiny_qwen3_tensors(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  E, H, KV, D = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
  M, V = config["intermediate_size"], config["vocab_size"]

  def weight(*shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) * 0.1).astype(ml_dtypes.bfloat16)

  def norm(n: int) -> np.ndarray:
    return (1.0 + 0.2 * rng.standard_normal(n)).astype(ml_dtypes.bfloat16)

  tensors = {"model.embed_tokens.weight": weight(V, E)}
  for i in range(config["num_hidden_layers"]):
    p = f"model.layers.{i}"
    tensors.update({
        f"{p}.input_layernorm.weight": norm(E),
        f"{p}.post_attention_layernorm.weight": norm(E),
        f"{p}.self_attn.q_proj.weight": weight(H * D, E),
        f"{p}.self_attn.k_proj.weight": weight(KV * D, E),
        f"{p}.self_attn.v_proj.weight": weight(KV * D, E),
        f"{p}.self_attn.o_proj.weight": weight(E, H * D),
        f"{p}.self_attn.q_norm.weight": norm(D),
        f"{p}.self_attn.k_norm.weight": norm(D),
        f"{p}.mlp.gate_proj.weight": weight(M, E),
        f"{p}.mlp.up_proj.weight": weight(M, E),
        f"{p}.mlp.down_proj.weight": weight(E, M),
    })
  tensors["model.norm.weight"] = norm(E)
  tensors["lm_head.weight"] = weight(V, E)
  return tensors


def write_tiny_qwen3(output_dir: str) -> None:
  os.makedirs(output_dir, exist_ok=True)
  with open(os.path.join(output_dir, "config.json"), "w") as f:
    json.dump(TINY_QWEN3_CONFIG, f, indent=2, sort_keys=True)
    f.write("\n")
  write_safetensors(os.path.join(output_dir, "model.safetensors"), tiny_qwen3_tensors(TINY_QWEN3_CONFIG))


def main(argv: list[str]) -> None:
  del argv
  output_dir = os.path.join(os.environ.get("BUILD_WORKING_DIRECTORY", os.getcwd()), FLAGS.output_dir)
  write_tiny_qwen3(output_dir)
  print(f"wrote {output_dir}")


if __name__ == "__main__":
  app.run(main)
