"""Compares a converted checkpoint's logits with the transformers reference on the same token ids, and checks the
restore onto the default backend's devices (and, on an accelerator, its forward pass) against the CPU's."""

from __future__ import annotations

import dataclasses
from typing import Any

from absl import logging
import jax
import numpy as np

from converter import families
from converter.model_config import load_model_config
from converter.checkpoint_format.record import ConversionRecord
from converter.storage import scratch
from tools import checkpoint_io, forward, quantize, weaver_checkpoint


@dataclasses.dataclass(frozen=True)
class Thresholds:
  """What a conversion's logits must meet against transformers'; the defaults are the bar for a float32
  conversion against float32 logits."""

  max_abs_diff: float = 1e-4
  min_cosine: float = 0.99999
  min_argmax_agreement: float = 1.0

  def missed(self, max_abs_diff: float, cosine: float, argmax_agreement: float) -> list[str]:
    """Each bound these figures miss, as a line of a failure report (empty when all are met)."""
    failed = []
    if not max_abs_diff <= self.max_abs_diff:
      failed.append(f"max|diff| {max_abs_diff:.3g} > {self.max_abs_diff:.3g}")
    if not cosine >= self.min_cosine:
      failed.append(f"cosine {cosine:.7f} < {self.min_cosine}")
    if not argmax_agreement >= self.min_argmax_agreement:
      failed.append(f"argmax agreement {argmax_agreement:.4f} < {self.min_argmax_agreement}")
    return failed


# The accelerator's forward pass (tools/forward.py at "highest" matmul precision, from the arrays restored onto
# it) against the CPU's on the same, bit-identical arrays, by family as the conversion records it; a family not
# named here is held to the float32 bar, `Thresholds()`. Even at full precision an accelerator's exp, tanh, erf
# and summation order differ from the CPU's in the last digits; these bounds say how far that may carry. Each is
# about twice the largest difference measured on a TPU v5e over every tiny model of the suites (docs/testing.md,
# "On a TPU v5e": the TPU suite logs one "accelerator forward" line per validation); where the difference is
# carried past any useful max|diff| (a recurrence, Sinkhorn rounds), the bound is on the direction and the choices.
ACCELERATOR_THRESHOLDS: dict[str, Thresholds] = {
    "gemma": Thresholds(max_abs_diff=3e-4),  # Measured 1.46e-4.
    "gemma2": Thresholds(max_abs_diff=6e-4),  # 3.05e-4 (soft caps: tanh).
    "gemma3": Thresholds(max_abs_diff=1.1e-3),  # 5.33e-4 (with its SigLIP tower).
    "gemma4": Thresholds(max_abs_diff=2e-3),  # 9.81e-4.
    "gemma4_small": Thresholds(max_abs_diff=4e-4),  # 2.02e-4.
    "llama": Thresholds(max_abs_diff=1.5e-4),  # 6.66e-5 (an rsLoRA-merged Llama 3.1).
    "qwen3": Thresholds(max_abs_diff=3e-4),  # 1.40e-4 (a LoRA-merged Qwen3); 2.9e-5 unmerged.
    "qwen3_5": Thresholds(max_abs_diff=1e-3),  # 5.09e-4.
    # Gated-delta recurrence: max|diff| 0.167, cosine 0.99995, argmax 100% (4 cases).
    "qwen3_next": Thresholds(max_abs_diff=0.35, min_cosine=0.9999, min_argmax_agreement=0.98),
    # Sinkhorn rounds and top-k choices: max|diff| 1.06 with FP8 experts, cosine 0.99981, argmax 100% (12 cases).
    "deepseek4": Thresholds(max_abs_diff=2.0, min_cosine=0.9996, min_argmax_agreement=0.98),
}


def accelerator_thresholds(family: str | None) -> Thresholds:
  """The bound of `family`'s accelerator forward against the CPU's (`ACCELERATOR_THRESHOLDS`)."""
  return ACCELERATOR_THRESHOLDS.get(family or "", Thresholds())


@dataclasses.dataclass(frozen=True)
class AcceleratorForward:
  """The forward pass on the accelerator, from the arrays restored onto it, against the CPU's forward pass from
  the same (bit-identical) arrays."""

  platform: str
  max_abs_diff: float
  cosine: float
  argmax_agreement: float
  thresholds: Thresholds

  def failures(self) -> list[str]:
    return [f"{self.platform} forward against the CPU's: {line}"
            for line in self.thresholds.missed(self.max_abs_diff, self.cosine, self.argmax_agreement)]


@dataclasses.dataclass(frozen=True)
class Report:
  """The CPU forward against transformers (max_abs_diff, cosine, argmax_agreement: what `failures` holds to the
  given thresholds), the restores, and on an accelerator its forward against the CPU's (to its own thresholds)."""

  max_abs_diff: float
  cosine: float
  argmax_agreement: float
  v0_v1_identical: bool
  leaves: int
  platform: str  # JAX's default backend, which the sharded restores went onto.
  device_restore_failures: tuple[str, ...]  # What the restores onto `platform` got wrong (`device_restore_check`).
  accelerator: AcceleratorForward | None  # None on the CPU, where the CPU forward is the only one.

  def failures(self, thresholds: Thresholds) -> list[str]:
    failed = [] if self.v0_v1_identical else ["v0 and v1 restores differ"]
    failed.extend(self.device_restore_failures)
    failed.extend(thresholds.missed(self.max_abs_diff, self.cosine, self.argmax_agreement))
    if self.accelerator is not None:
      failed.extend(self.accelerator.failures())
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
    with scratch.directory("validate") as plain:
      return reference_logits(quantize.dequantize(hf_model_path, plain), ids, weights_dtype)
  if weaver_checkpoint.is_weaver(hf_model_path):  # transformers has no Weaver: the Qwen3-VL it renames runs.
    with scratch.directory("validate") as renamed:
      return reference_logits(weaver_checkpoint.as_qwen3_vl(hf_model_path, renamed), ids, weights_dtype)

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


def _first(keys: list[str], shown: int = 3) -> str:
  return ", ".join(keys[:shown]) + (f" and {len(keys) - shown} more" if len(keys) > shown else "")


def device_restore_check(api: str, restored: Any, abstract: Any, expected: Any, platform: str) -> list[str]:
  """What a restore onto `platform`'s devices (`checkpoint_io.restore_v0_sharded` / `restore_v1_sharded`) got
  wrong: array leaves that are not `jax.Array`s, not on `platform` alone, or not sharded as `abstract` asked;
  and any leaf whose bytes differ from `expected`, the numpy restore. Empty when it is right."""
  got = {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(restored)[0]}
  not_arrays, elsewhere, misplaced = [], {}, []
  for path, want in jax.tree_util.tree_flatten_with_path(abstract)[0]:
    if not isinstance(want, jax.ShapeDtypeStruct):
      continue
    key = jax.tree_util.keystr(path)
    leaf = got.get(key)
    if not isinstance(leaf, jax.Array):
      not_arrays.append(key)
      continue
    platforms = ", ".join(sorted({d.platform for d in leaf.devices()}))
    if platforms != platform:
      elsewhere.setdefault(platforms, []).append(key)
    elif leaf.sharding != want.sharding:
      misplaced.append(f"{key} ({getattr(leaf.sharding, 'spec', leaf.sharding)}, not {want.sharding.spec})")
  failed = []
  if not_arrays:
    failed.append(f"{api} restore onto the {platform}: not a jax.Array: {_first(not_arrays)}")
  for platforms, keys in elsewhere.items():
    failed.append(f"{api} restore onto the {platform}: on {platforms}, not {platform}: {_first(keys)}")
  if misplaced:
    failed.append(f"{api} restore onto the {platform}: sharded otherwise than asked: {_first(misplaced)}")
  diffs = checkpoint_io.trees_bit_identical(expected, restored)
  if diffs:
    failed.append(f"{api} restore onto the {platform} differs from the CPU restore: {_first(diffs)}")
  return failed


@dataclasses.dataclass(frozen=True)
class CheckpointLogits:
  """What `checkpoint_logits` computed and checked."""

  logits: np.ndarray  # The CPU forward's, from the numpy v0 restore.
  tree: Any  # The numpy v0 restore.
  v0_v1_identical: bool
  family: str | None  # As the conversion recorded it.
  platform: str  # JAX's default backend, which the sharded restores went onto.
  device_restore_failures: tuple[str, ...]
  accelerator_logits: np.ndarray | None  # The forward on `platform` from its v0 restore; None on the CPU.


def checkpoint_logits(hf_model_path: str, items_path: str, ids: np.ndarray) -> CheckpointLogits:
  """Our forward on the host's CPU from the checkpoint restored as numpy through v0, and whether the v1 restore is
  bit-identical. Also restores it as MaxText does on the hardware, through v0 and v1 onto every device of JAX's
  default backend (sharded on fsdp: `checkpoint_io.sharded_abstract_tree`), and checks both against the numpy
  restore (`device_restore_check`): on the CPU suite that is the CPU, so CI runs the same path. On an accelerator
  the forward runs again there, from its own restore. One restored tree besides the numpy one is alive at a time."""
  tree = checkpoint_io.restore_v0(items_path)
  identical = not checkpoint_io.trees_bit_identical(tree, checkpoint_io.restore_v1(items_path, tree))
  runtime, layout = recorded_runtime(hf_model_path, items_path, tree)
  ours = forward.logits(dequantize_fp8_leaves(tree["params"]["params"]), ids, runtime, layout)

  platform = jax.default_backend()
  abstract = checkpoint_io.sharded_abstract_tree(items_path, checkpoint_io.restore_mesh(platform))
  failed = device_restore_check("v1", checkpoint_io.restore_v1_sharded(items_path, abstract), abstract, tree,
                                platform)
  on_device = checkpoint_io.restore_v0_sharded(items_path, abstract)
  failed += device_restore_check("v0", on_device, abstract, tree, platform)
  accelerator = None
  if platform != "cpu":
    accelerator = forward.logits(dequantize_fp8_leaves(on_device["params"]["params"]), ids, runtime, layout,
                                 platform=platform)
  return CheckpointLogits(ours, tree, identical, ConversionRecord.read(items_path).family, platform, tuple(failed),
                          accelerator)


def accelerator_forward(checked: CheckpointLogits) -> AcceleratorForward | None:
  """The accelerator's logits against the CPU's, held to the family's `ACCELERATOR_THRESHOLDS`; None on the CPU.
  Logs one line, so that an accelerator run's log holds every figure that table is tuned from."""
  if checked.accelerator_logits is None:
    return None
  compared = AcceleratorForward(checked.platform, *compare_logits(checked.accelerator_logits, checked.logits),
                                accelerator_thresholds(checked.family))
  logging.info("accelerator forward: family %s, %s against the CPU: max|diff| %.3e, cosine %.9f, argmax %.4f",
               checked.family, compared.platform, compared.max_abs_diff, compared.cosine, compared.argmax_agreement)
  return compared


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
  checked = checkpoint_logits(hf_model_path, items_path, ids)
  if reference is None:
    reference = reference_logits(hf_model_path, ids, ConversionRecord.read(items_path).save_dtype or "float32")
  diff, cosine, agreement = compare_logits(checked.logits, reference)
  return Report(diff, cosine, agreement, checked.v0_v1_identical, len(checkpoint_io.flatten(checked.tree)),
                checked.platform, checked.device_restore_failures, accelerator_forward(checked))
