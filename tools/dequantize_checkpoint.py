"""Writes a quantized checkpoint's dequantized copy: the separate pass MaxText's route needs before converting.

  bazel run //tools:dequantize_checkpoint -- --input=/models/DeepSeek-V3 --output=/models/DeepSeek-V3-bf16

What DeepSeek's `fp8_cast_bf16.py` and MaxText's `deepseek_dequantize.py` do, tensor by tensor through the
converter's own sources (so the benchmark compares routes, not dequantizers): every tensor read whole in bfloat16
and streamed into shards of `--max_shard_size`, config.json written without its quantization_config. The
benchmark times it against converting the quantized checkpoint directly.
"""

from __future__ import annotations

import json
import os

from absl import app, flags

from converter.model_config import load_model_config
from converter.reverse.safetensors_output import (INDEX_FILE, SafetensorsStreamWriter, TensorSpec, assign_shards, index_json,
                                          parse_size, shard_names)
from converter.sources import open_source

FLAGS = flags.FLAGS
flags.DEFINE_string("input", None, "Quantized HF checkpoint directory.", required=True)
flags.DEFINE_string("output", None, "Directory for the dequantized copy.", required=True)
flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "dtype of the copy.")
flags.DEFINE_string("max_shard_size", "5GB", "Largest shard of the copy.")


def dequantize_checkpoint(input_dir: str, output_dir: str, dtype: str, max_shard_size: str) -> int:
  """Returns the bytes written."""
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  config = load_model_config(input_dir)
  source = open_source(input_dir, config.raw, config.path)
  target = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)
  names = sorted(source.tensors)
  specs = [TensorSpec(n, tuple(source.tensors[n].shape), target) for n in names]
  shards = assign_shards(specs, parse_size(max_shard_size))
  files = shard_names(len(shards))
  os.makedirs(output_dir, exist_ok=True)
  for file_name, shard in zip(files, shards):
    writer = SafetensorsStreamWriter(os.path.join(output_dir, file_name), [specs[i] for i in shard])
    for i in shard:
      writer.write(specs[i].name, source.tensors[specs[i].name].read(target))
    writer.close()
    with open(os.path.join(output_dir, file_name), "rb+") as f:
      os.fsync(f.fileno())
  if len(files) > 1:
    with open(os.path.join(output_dir, INDEX_FILE), "w") as f:
      json.dump(index_json(specs, {specs[i].name: name for name, shard in zip(files, shards) for i in shard}), f)
  with open(config.path) as f:
    raw = json.load(f)
  raw.pop("quantization_config", None)
  with open(os.path.join(output_dir, "config.json"), "w") as f:
    json.dump(dict(raw, torch_dtype=dtype), f, indent=2)
  return sum(s.nbytes for s in specs)


def main(argv: list[str]) -> None:
  del argv
  written = dequantize_checkpoint(FLAGS.input, FLAGS.output, FLAGS.dtype, FLAGS.max_shard_size)
  print(f"wrote {written:,} bytes to {FLAGS.output}")


if __name__ == "__main__":
  app.run(main)
