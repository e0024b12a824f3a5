"""Random PEFT LoRA adapters for the tiny models, and transformers + peft logits with one merged or applied (test
only: imports torch and peft 0.21.2).

The adapters are made by peft itself (`get_peft_model`, `save_pretrained`), so their files are exactly what users
have; every factor is then drawn at random (peft initialises lora_B to zeros, which would let a converter that
drops the adapter pass), large enough that the adapter moves the tiny models' logits by O(1).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

# Every linear module of a Llama/Qwen3 decoder layer: attention and MLP.
DECODER_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class AdapterSpec:
  """What `peft.LoraConfig` receives (r, alpha, targets, rslora, per-module patterns)."""

  r: int = 4
  lora_alpha: float = 12.0
  target_modules: tuple[str, ...] = DECODER_TARGETS
  use_rslora: bool = False
  rank_pattern: dict[str, int] = dataclasses.field(default_factory=dict)
  alpha_pattern: dict[str, float] = dataclasses.field(default_factory=dict)
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # Any other LoraConfig field (modules_to_save).


def _base_model(model_dir: str):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                             attn_implementation="eager")
  return model.eval()


def make_adapter(model_dir: str, output_dir: str, spec: AdapterSpec = AdapterSpec(), seed: int = 0,
                 std: float = 0.1) -> str:
  """A peft adapter for the model in `model_dir`, its factors ~ N(0, std^2), saved to `output_dir`."""
  import peft  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  config = peft.LoraConfig(r=spec.r, lora_alpha=spec.lora_alpha, target_modules=list(spec.target_modules),
                           use_rslora=spec.use_rslora, rank_pattern=dict(spec.rank_pattern),
                           alpha_pattern=dict(spec.alpha_pattern), lora_dropout=0.0, task_type="CAUSAL_LM",
                           **spec.extra)
  model = peft.get_peft_model(_base_model(model_dir), config)
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, tensor in sorted(model.named_parameters()):
      if ".lora_A." in name or ".lora_B." in name:
        tensor.copy_(std * torch.randn(tensor.shape, generator=generator))
  model.save_pretrained(output_dir)
  return output_dir


def merged_logits(model_dir: str, adapter_dir: str, ids: np.ndarray, merge: bool = True) -> np.ndarray:
  """float32 logits of the base model with the adapter: merged by peft (`merge_and_unload`), or applied as
  LoRA layers (`merge=False`: peft's own forward, what `PeftModel.from_pretrained` users run)."""
  import peft  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  model = peft.PeftModel.from_pretrained(_base_model(model_dir), adapter_dir).eval()
  if merge:
    model = model.merge_and_unload()
  with torch.no_grad():
    return model(torch.from_numpy(ids.astype(np.int64))).logits.numpy()


# Where MaxText 0.2.5 keeps the Llama/Qwen3 decoder's projections (models/llama2.py, qwen3.py), and which are
# head-reshaped on their output side (H, D) in MaxText's kernel.
_MAXTEXT_MODULES = {"q_proj": "self_attention/query", "k_proj": "self_attention/key", "v_proj": "self_attention/value",
                    "o_proj": "self_attention/out", "gate_proj": "mlp/wi_0", "up_proj": "mlp/wi_1",
                    "down_proj": "mlp/wo"}


def write_maxtext_lora_checkpoint(adapter_dir: str, output_dir: str, *, num_layers: int, scan_layers: bool,
                                  head_dim: int, interleave_rope: bool = False, query_scale: float | None = None,
                                  nnx_layout: bool = False) -> str:
  """A PEFT adapter of a Llama/Qwen3 model as MaxText 0.2.5's LoRA training saves its qwix factors; returns
  OUTPUT_DIR/0/items.

  Written from the layout measured on MaxText 0.2.5 itself (qwix LoraProvider applied to the tiny Qwen3 by
  `lora_utils.apply_lora_to_model`; docs/lora.md), independently of converter/lora/lora_export.py: beside each kernel,
  `kernel_lora_a` = A.T (in, r) and `kernel_lora_b` = B.T (r, out), the output side in the kernel's order (Llama
  3.1's q/k heads RoPE-interleaved, the query scaled, as MaxText's to_maxtext adapter mode writes them), scanned
  leaves stacked at axis 1; under params/params (`nnx_layout`: as NNX state, `decoder/layers/0/.../value`), with
  `lora` {lora_rank, lora_alpha} and `scan_layers` in the step's custom_metadata.
  """
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

  with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
    config = json.load(f)
  tensors = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
  per_layer: dict[tuple[str, str], list[np.ndarray]] = {}
  for layer in range(num_layers):
    for hf_name, path in _MAXTEXT_MODULES.items():
      section = "self_attn" if path.startswith("self_attention") else "mlp"
      prefix = f"base_model.model.model.layers.{layer}.{section}.{hf_name}"
      if f"{prefix}.lora_A.weight" not in tensors:
        continue
      lora_a = tensors[f"{prefix}.lora_A.weight"].T.astype(np.float32)
      lora_b = tensors[f"{prefix}.lora_B.weight"].T.astype(np.float32)
      if hf_name in ("q_proj", "k_proj") and interleave_rope:  # Each head's halves as interleaved pairs.
        heads = lora_b.reshape(lora_b.shape[0], -1, 2, head_dim // 2)
        lora_b = np.ascontiguousarray(heads.transpose(0, 1, 3, 2)).reshape(lora_b.shape)
      if hf_name == "q_proj" and query_scale is not None:
        lora_b = (lora_b * np.float32(query_scale)).astype(np.float32)
      per_layer.setdefault((path, "kernel_lora_a"), []).append(lora_a)
      per_layer.setdefault((path, "kernel_lora_b"), []).append(lora_b)
  tree: dict[str, Any] = {}
  for (path, leaf), values in per_layer.items():
    layers = [(("layers",), np.stack(values, axis=1))] if scan_layers else [
        ((("layers", str(i)) if nnx_layout else (f"layers_{i}",)), v) for i, v in enumerate(values)]
    for layer_keys, value in layers:
      node = tree.setdefault("decoder", {})
      for key in (*layer_keys, *path.split("/")):
        node = node.setdefault(key, {})
      node[leaf] = {"value": value} if nnx_layout else value
  items = os.path.join(output_dir, "0", "items")
  ocp.PyTreeCheckpointer().save(items, tree if nnx_layout else {"params": {"params": tree}})
  metadata = {"custom_metadata": {"scan_layers": scan_layers,
                                  "lora": {"enable_lora": True, "lora_rank": config["r"],
                                           "lora_alpha": config["lora_alpha"]}}}
  with open(os.path.join(output_dir, "0", "_CHECKPOINT_METADATA"), "w") as f:
    json.dump(metadata, f)
  return items


def write_random_adapter(model_dir: str, output_dir: str, modules: tuple[str, ...], r: int = 2,
                         lora_alpha: float = 4.0, seed: int = 0) -> str:
  """A minimal PEFT adapter file pair for `modules` of the safetensors checkpoint in `model_dir` (numpy only, for
  tests that need an adapter of a synthetic checkpoint transformers cannot build); returns `output_dir`."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  from converter.sources import open_safetensors  # pylint: disable=g-import-not-at-top
  from tools.safetensors_writer import write_safetensors  # pylint: disable=g-import-not-at-top

  stored = open_safetensors(model_dir).tensors
  rng = np.random.default_rng(seed)
  tensors = {}
  for module in modules:
    out_dim, in_dim = stored[module + ".weight"].shape
    tensors[f"base_model.model.{module}.lora_A.weight"] = rng.standard_normal((r, in_dim), np.float32)
    tensors[f"base_model.model.{module}.lora_B.weight"] = rng.standard_normal((out_dim, r), np.float32)
  os.makedirs(output_dir, exist_ok=True)
  write_safetensors(os.path.join(output_dir, "adapter_model.safetensors"), tensors)
  with open(os.path.join(output_dir, "adapter_config.json"), "w") as f:
    json.dump({"peft_type": "LORA", "r": r, "lora_alpha": lora_alpha,
               "target_modules": sorted({m.rsplit(".", 1)[-1] for m in modules})}, f)
  return output_dir
