"""Compares a converted checkpoint's logits with the transformers reference on the same token ids."""

from __future__ import annotations

import dataclasses
import tempfile
from typing import Any

import numpy as np

from converter import families
from converter.model_config import load_model_config
from converter.output.record import ConversionRecord
from tools import checkpoint_io, forward, quantize


@dataclasses.dataclass(frozen=True)
class Thresholds:
  """What a conversion's logits must meet against transformers'; the defaults are the bar for a float32
  conversion against float32 logits."""

  max_abs_diff: float = 1e-4
  min_cosine: float = 0.99999
  min_argmax_agreement: float = 1.0


@dataclasses.dataclass(frozen=True)
class Report:
  max_abs_diff: float
  cosine: float
  argmax_agreement: float
  v0_v1_identical: bool
  leaves: int

  def failures(self, thresholds: Thresholds) -> list[str]:
    failed = []
    if not self.v0_v1_identical:
      failed.append("v0 and v1 restores differ")
    if not self.max_abs_diff <= thresholds.max_abs_diff:
      failed.append(f"max|diff| {self.max_abs_diff:.3g} > {thresholds.max_abs_diff:.3g}")
    if not self.cosine >= thresholds.min_cosine:
      failed.append(f"cosine {self.cosine:.7f} < {thresholds.min_cosine}")
    if not self.argmax_agreement >= thresholds.min_argmax_agreement:
      failed.append(f"argmax agreement {self.argmax_agreement:.4f} < {thresholds.min_argmax_agreement}")
    return failed


def token_ids(vocab_size: int, batch: int, seq_len: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, vocab_size, size=(batch, seq_len), dtype=np.int32)


def reference_logits(hf_model_path: str, ids: np.ndarray, weights_dtype: str = "float32") -> np.ndarray:
  """transformers' logits in float32; weights first rounded to `weights_dtype` (the dtype the checkpoint holds).
  A quantized checkpoint runs as its numpy dequantization (tools/quantize.py), which is independent of ours."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from transformers.models.auto import modeling_auto  # pylint: disable=g-import-not-at-top

  if quantize.is_quantized(hf_model_path):
    with tempfile.TemporaryDirectory() as plain:
      return reference_logits(quantize.dequantize(hf_model_path, plain), ids, weights_dtype)

  # Eager attention: the reference for sinks, sliding windows, chunks and sparse indexers alike. Multimodal wrappers
  # without a causal-LM class (Qwen3-VL) run as image-text-to-text models, on text alone.
  model_type = transformers.AutoConfig.from_pretrained(hf_model_path).model_type
  auto = (transformers.AutoModelForCausalLM if model_type in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
          else transformers.AutoModelForImageTextToText)
  if model_type == "qwen3_omni_moe":  # Qwen3-Omni: the thinker makes the text logits (its talker only speaks them).
    model = transformers.Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        hf_model_path, dtype=torch.float32, attn_implementation="eager").thinker
  else:
    model = auto.from_pretrained(hf_model_path, dtype=torch.float32, attn_implementation="eager")
  model.eval()
  if weights_dtype != "float32":
    with torch.no_grad():
      for p in model.parameters():
        p.copy_(p.to(getattr(torch, weights_dtype)).to(torch.float32))
  with torch.no_grad():
    return model(torch.from_numpy(ids.astype(np.int64))).logits.numpy()


def compare_logits(ours: np.ndarray, reference: np.ndarray) -> tuple[float, float, float]:
  ours, reference = ours[..., : reference.shape[-1]], reference  # Padded vocab entries have no reference.
  diff = float(np.max(np.abs(ours - reference)))
  a, b = ours.ravel().astype(np.float64), reference.ravel().astype(np.float64)
  cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
  agreement = float(np.mean(np.argmax(ours, -1) == np.argmax(reference, -1)))
  return diff, cosine, agreement


def recorded_runtime(hf_model_path: str, items_path: str, tree: Any) -> tuple[families.Runtime, families.Layout]:
  """What MaxText computes with the checkpoint, from what the converter recorded in it: the overrides exactly as
  recorded (what a user passes to MaxText), the decoder's fixed rules and the layout of the recorded target."""
  record = ConversionRecord.read(items_path)
  model = families.resolve(load_model_config(hf_model_path), family=record.family, target_model=record.target_model)
  params = tree["params"]["params"]
  scan_layers = record.scan_layers if record.scan_layers is not None else "layers" in params["decoder"]
  runtime = model.runtime
  if record.maxtext_overrides is not None:
    runtime = families.Runtime(families.MaxTextConfig.from_overrides(record.maxtext_overrides), model.runtime.decoder)
  return runtime, model.layout(params["token_embedder"]["embedding"].shape[0], scan_layers)


def dequantize_fp8_leaves(node: Any) -> Any:
  """A native fp8 tree as MaxText computes with it (layers/quantizations.py `dequantize_weight`, in float32): each
  FP8 leaf `x` times its sibling `x_scale`, every scale value over the d / s consecutive elements it covers on
  each axis; the scale leaves dropped."""
  if not isinstance(node, dict):
    return node

  def fp8(key: str) -> bool:  # Not every `x` beside an `x_scale` is FP8 (DeepSeek V4's mHC pre_alpha).
    return key in node and not isinstance(node[key], dict) and np.dtype(node[key].dtype).itemsize == 1

  out = {}
  for key, value in node.items():
    if key.endswith("_scale") and fp8(key[: -len("_scale")]):
      continue
    scale = node.get(f"{key}_scale") if fp8(key) else None
    if scale is not None:
      value, scale = np.asarray(value).astype(np.float32), np.asarray(scale, np.float32)
      interleaved = tuple(x for s, d in zip(scale.shape, value.shape) for x in (s, d // s))
      value = (value.reshape(interleaved) * scale.reshape(tuple(x for s in scale.shape for x in (s, 1))))
      value = value.reshape(np.shape(node[key]))
    out[key] = dequantize_fp8_leaves(value)
  return out


def checkpoint_logits(hf_model_path: str, items_path: str, ids: np.ndarray) -> tuple[np.ndarray, Any, bool]:
  """Our forward on the checkpoint restored through v0; also whether the v1 restore is bit-identical."""
  tree = checkpoint_io.restore_v0(items_path)
  v1_tree = checkpoint_io.restore_v1(items_path, tree)
  identical = not checkpoint_io.trees_bit_identical(tree, v1_tree)
  runtime, layout = recorded_runtime(hf_model_path, items_path, tree)
  params = dequantize_fp8_leaves(tree["params"]["params"])
  return forward.logits(params, ids, runtime, layout), tree, identical


def validate(
    hf_model_path: str,
    items_path: str,
    *,
    batch: int = 2,
    seq_len: int = 32,
    seed: int = 0,
    reference: np.ndarray | None = None,
) -> Report:
  """`reference` may be passed in when several checkpoints of one model are validated against it."""
  config = load_model_config(hf_model_path)
  ids = token_ids(config.vocab_size, batch, seq_len, seed)
  ours, tree, identical = checkpoint_logits(hf_model_path, items_path, ids)
  if reference is None:
    saved_dtype = ConversionRecord.read(items_path).save_dtype or "float32"
    reference = reference_logits(hf_model_path, ids, saved_dtype)
  diff, cosine, agreement = compare_logits(ours, reference)
  return Report(diff, cosine, agreement, identical, len(checkpoint_io.flatten(tree)))
