"""A MaxText LoRA checkpoint written back as a PEFT adapter directory (--export=lora_adapter): its factors as
converter/lora/lora_export.py plans them, in PEFT's layout, staged and published whole."""

from __future__ import annotations

import json
import math
from typing import Any, Callable

from converter import storage
from converter.checkpoint_format.layout import items_path_of
from converter.lora.lora_export import AdapterExport, peft_factors, plan_adapter_export, read_leaf
from converter.options import ReverseOptions, RunContext
from converter.output.huggingface import HuggingFaceOutput
from converter.reverse.safetensors_output import SafetensorsStreamWriter, TensorSpec
from converter.sources.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, LORA_A, LORA_B, PREFIX


def adapter_config(export: AdapterExport) -> dict[str, Any]:
  """adapter_config.json: what PEFT needs to load the factors as they are (plain LoRA, scale alpha / r)."""
  return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": export.base_model,
          "r": export.rank, "lora_alpha": export.alpha,
          "target_modules": sorted({m.module.rsplit(".", 1)[-1] for m in export.modules}),
          "lora_dropout": 0.0, "bias": "none", "use_rslora": False, "use_dora": False, "fan_in_fan_out": False,
          "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}, "init_lora_weights": True,
          "inference_mode": True}


def export_lora_adapter(checkpoint_path: str, output_dir: str, options: ReverseOptions = ReverseOptions(),
                        run: RunContext = RunContext()) -> AdapterExport:
  """Writes the MaxText LoRA checkpoint at `checkpoint_path` as a PEFT adapter directory `output_dir`, staged and
  published whole (converter/output/huggingface.py)."""
  from converter.sources.checkpoint_reader import CheckpointReader  # pylint: disable=g-import-not-at-top

  items_path = items_path_of(checkpoint_path)
  reader = CheckpointReader(items_path)
  export = plan_adapter_export(items_path, options, reader)
  specs = []
  for module in export.modules:
    a_shape = (export.rank, math.prod(module.sides.in_shape))
    b_shape = (math.prod(module.sides.out_shape), export.rank)
    specs += [TensorSpec(PREFIX + module.module + LORA_A, a_shape, export.dtype),
              TensorSpec(PREFIX + module.module + LORA_B, b_shape, export.dtype)]

  def write_factors(directory: str, finished: Callable[[str], None]) -> None:
    path = storage.join(directory, ADAPTER_WEIGHTS)
    writer = SafetensorsStreamWriter(path, specs)
    try:
      for module in export.modules:
        lora_a = read_leaf(reader, module.leaf_a, module.index)
        lora_b = read_leaf(reader, module.leaf_b, module.index)
        a, b = peft_factors(module.sides, lora_a, lora_b)
        writer.write(PREFIX + module.module + LORA_A, a.astype(export.dtype, copy=False))
        writer.write(PREFIX + module.module + LORA_B, b.astype(export.dtype, copy=False))
    except BaseException:
      writer.abort()
      raise
    writer.close()
    finished(path)

  HuggingFaceOutput(storage.resolve(output_dir), run, hub_private=options.hub_private).write(
      write_factors, lambda: {ADAPTER_CONFIG: json.dumps(adapter_config(export), indent=2, sort_keys=True) + "\n"})
  return export
