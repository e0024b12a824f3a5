"""A PEFT LoRA adapter as a MaxText LoRA checkpoint (MaxText's Adapter mode): what MaxText 0.2.5's LoRA training
restores with `lora.lora_restore_path` to continue from, without the base being converted again.

MaxText restores LoRA factors into the qwix `LoRAParam`s of its NNX model (`lora_utils.restore_lora_from_path`):
a PyTree checkpoint whose tree is `nnx.state(model, nnx.LoRAParam)`'s, each factor under `value`, e.g.
`decoder/layers/self_attention/query/kernel_lora_a/value` (scanned: (E, L, r), the layer axis where the kernel has
it) or `decoder/layers_0/...` (unscanned), with `lora` {lora_rank, lora_alpha} in the step's custom_metadata, from
which it takes the rank and alpha (measured on MaxText 0.2.5's tiny Qwen3). The factors are PEFT's, turned into
qwix's by the family's own kernel ops (`lora_export.qwix_factors`: A.T, and B.T with the output side's RoPE
interleave or query scale applied), stacked per layer group. MaxText has one rank and one alpha per run, and
scales by alpha / r: an adapter with rank or alpha patterns or rsLoRA is refused by name, as a module whose kernel
is not one linear weight (experts, packed leaves) is. An adapter is small (rank x (in + out) per module): it is
read and written whole.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_dtypes
import numpy as np

from converter import families, storage
from converter.errors import ConversionError
from converter.lora.lora_export import LORA_A_SUFFIX, LORA_B_SUFFIX, kernel_sides, layout_modules, qwix_factors
from converter.model_config import ModelConfig, check_claimed_counts
from converter.sources.lora import LoraAdapter

VALUE = "value"  # Where an NNX Variable's array sits in a saved state.


@dataclasses.dataclass(frozen=True)
class LoraCheckpoint:
  """The tree a LoRA checkpoint holds (leaf path -> factor), and what its metadata records."""

  tree: dict[str, Any]
  rank: int
  alpha: float
  modules: int
  target_model: str

  @property
  def custom_metadata(self) -> dict[str, Any]:
    return {"lora": {"lora_rank": self.rank, "lora_alpha": self.alpha}}


def _uniform(adapter: LoraAdapter) -> None:
  """Refuses what MaxText's single rank, single alpha and alpha / r scale cannot hold."""
  why = None
  if adapter.use_rslora:
    why = "use_rslora scales by alpha / sqrt(r); MaxText's LoRA scales by alpha / r"
  elif {m.rank for m in adapter.modules} != {adapter.rank} or {m.alpha for m in adapter.modules} != {adapter.alpha}:
    why = "its rank_pattern / alpha_pattern give modules their own r or lora_alpha; a MaxText LoRA run has one of each"
  if why:
    raise ConversionError(f"{adapter.location}: cannot be a MaxText LoRA checkpoint: {why}")


def plan_lora_checkpoint(adapter: LoraAdapter, config: ModelConfig, *, target_model: str | None, scan_layers: bool,
                         save_dtype: str, family: str | None = None) -> LoraCheckpoint:
  """Every adapted module's factors in MaxText's tree; refuses a module the layout does not hold as one linear
  weight, naming it."""
  _uniform(adapter)
  dtype = np.dtype(ml_dtypes.bfloat16) if save_dtype == "bfloat16" else np.dtype(save_dtype)
  check_claimed_counts(config, (t.shape for m in adapter.modules for t in (m.a, m.b)), adapter.location)
  model = families.resolve(config, family=family, target_model=target_model, text_only=True)
  layout = model.layout(config.vocab_size, scan_layers)
  by_name = {m.module: m for m in adapter.modules}
  stacks: dict[tuple[str, ...], dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, int]]] = {}
  used = set()
  for param, kernel, index, stacking, hf_name in layout_modules(layout):
    module = by_name.get(hf_name.removesuffix(".weight"))
    if module is None:
      continue
    try:
      sides = kernel_sides(param)
    except ValueError as e:
      raise ConversionError(f"{adapter.weights_path}: module {module.module!r}: {model.family.name}'s {param.maxtext}"
                            f" cannot carry a MaxText LoRA factor pair: {e}") from e
    a, b = (t.read(np.float32) for t in (module.a, module.b))
    if a.shape != (adapter.rank, int(np.prod(sides.in_shape))) or b.shape != (int(np.prod(sides.out_shape)),
                                                                              adapter.rank):
      raise ConversionError(f"{adapter.weights_path}: module {module.module!r}: lora_A {a.shape} and lora_B {b.shape}"
                            f" do not fit {param.hf} {tuple(param.hf_shape)} with r = {adapter.rank}")
    lora_a, lora_b = qwix_factors(sides, a, b)
    position = tuple(i for i in index if isinstance(i, int))
    stacks.setdefault(kernel, {})[position] = (lora_a, lora_b, param.scan_axis if stacking else -1)
    used.add(module.module)
  unused = sorted(set(by_name) - used)
  if unused:
    raise ConversionError(f"{adapter.weights_path}: {len(unused)} adapted module(s) that {model.family.name}"
                          f" ({model.target}) has no linear weight for: {', '.join(unused[:5])}")
  tree: dict[str, Any] = {}
  for kernel, layers in stacks.items():
    for suffix, side in ((LORA_A_SUFFIX, 0), (LORA_B_SUFFIX, 1)):
      axis = next(iter(layers.values()))[2]
      if axis < 0:
        value = layers[()][side]
      else:
        value = np.stack([layers[p][side] for p in sorted(layers)], axis=axis)
      node = tree
      for key in (*kernel[:-1], kernel[-1] + suffix):
        node = node.setdefault(key, {})
      node[VALUE] = value.astype(dtype)
  return LoraCheckpoint(tree, adapter.rank, adapter.alpha, len(used), model.target)


def write_lora_checkpoint(checkpoint: LoraCheckpoint, output_dir: str) -> str:
  """Saves the tree as MaxText saves a LoRA run's step 0 (OUTPUT_DIR/0/items, the `lora` custom metadata);
  returns the items path. Orbax writes it to a temporary directory and renames it: a failure leaves no step."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  if storage.exists(output_dir) and storage.list_names(output_dir):
    raise ConversionError(f"{output_dir}: exists and is not empty; a LoRA checkpoint goes into a new directory")
  manager = ocp.CheckpointManager(output_dir, item_names=("items",),
                                  options=ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False))
  try:
    manager.save(0, args=ocp.args.Composite(items=ocp.args.PyTreeSave(checkpoint.tree)),
                 custom_metadata=checkpoint.custom_metadata)
    manager.wait_until_finished()
  finally:
    manager.close()
  return f"{output_dir.rstrip('/')}/0/items"
