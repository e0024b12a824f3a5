"""Converts a HuggingFace safetensors checkpoint into a MaxText-ready Orbax checkpoint.

  bazel run //converter -- --hf_model_path=/models/Qwen3-8B --output_dir=/ckpt/qwen3-8b

MaxText then loads it with `load_parameters_path=<output_dir>/0/items`.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

from absl import app, flags, logging

FLAGS = flags.FLAGS

flags.DEFINE_string("hf_model_path", None, "HF checkpoint directory (config.json + safetensors).")
flags.DEFINE_string("output_dir", None, "Directory for the Orbax checkpoint; step 0 is written to OUTPUT_DIR/0.")
flags.DEFINE_boolean("scan_layers", True, "Stack decoder layers into one leaf per parameter (MaxText scan_layers).")
flags.DEFINE_boolean("lazy_load_tensors", True, "Read each tensor only when Orbax writes it (false: read all first).")
flags.DEFINE_integer(
    "simulated_cpu_devices_count", 16, "CPU devices JAX simulates; leaves are sharded over them when > 1.", lower_bound=1
)
flags.DEFINE_enum("save_dtype", "bfloat16", ["bfloat16", "float32"], "dtype of every saved parameter.")
flags.DEFINE_boolean("overwrite", False, "Replace an existing checkpoint at OUTPUT_DIR/0.")
flags.DEFINE_string("target_model", None, "MaxText model the checkpoint is for (default: inferred from config.json).")
flags.DEFINE_integer("target_vocab_size", None, "Zero-pad the vocabulary to this size (MaxText configs may round up).")
flags.DEFINE_boolean("allow_unused_tensors", False, "Warn about, rather than refuse, tensors the family does not use.")
flags.DEFINE_integer("max_inflight_bytes", 1 << 30, "Most bytes of materialised tensors alive at once while saving.")
flags.mark_flags_as_required(["hf_model_path", "output_dir"])


def _resolve(path: str) -> str:
  """Relative paths are relative to where the user ran `bazel run`, not to Bazel's runfiles directory."""
  base = os.environ.get("BUILD_WORKING_DIRECTORY", os.getcwd())
  return os.path.abspath(os.path.join(base, os.path.expanduser(path)))


def _start_jax(devices: int) -> None:
  """Simulated CPU devices must be configured before JAX initialises a backend."""
  import jax  # pylint: disable=g-import-not-at-top

  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_num_cpu_devices", devices)
  if len(jax.devices()) != devices:
    raise app.UsageError(f"JAX started with {len(jax.devices())} devices, not {devices}")


def _peak_rss_bytes() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run() -> None:
  _start_jax(FLAGS.simulated_cpu_devices_count)
  from converter import conversion  # pylint: disable=g-import-not-at-top

  start = time.monotonic()
  result = conversion.convert_to_maxtext(
      hf_model_path=_resolve(FLAGS.hf_model_path),
      output_dir=_resolve(FLAGS.output_dir),
      scan_layers=FLAGS.scan_layers,
      lazy=FLAGS.lazy_load_tensors,
      devices=FLAGS.simulated_cpu_devices_count,
      save_dtype=FLAGS.save_dtype,
      overwrite=FLAGS.overwrite,
      target_model=FLAGS.target_model,
      target_vocab_size=FLAGS.target_vocab_size,
      allow_unused_tensors=FLAGS.allow_unused_tensors,
      max_inflight_bytes=FLAGS.max_inflight_bytes,
  )
  seconds = time.monotonic() - start
  plan = result.plan
  print(f"family:        {plan.family.name} ({plan.config.architecture}), target model {plan.target_model}")
  print(f"leaves:        {len(plan.leaves)} ({'scanned' if plan.scan_layers else 'unscanned'}, {plan.save_dtype.name})")
  print(f"bytes:         {plan.total_bytes:,}")
  print(f"seconds:       {seconds:.2f}")
  print(f"peak RSS:      {_peak_rss_bytes() / 2**20:.0f} MiB")
  print(f"devices:       {FLAGS.simulated_cpu_devices_count} ({'lazy' if FLAGS.lazy_load_tensors else 'eager'})")
  print(f"output:        {result.items_path}")
  for warning in plan.warnings:
    print(f"warning:       {warning}")
  print(f"MaxText:       load_parameters_path={result.items_path} "
        + " ".join(f"{k}={json.dumps(v)}" for k, v in result.overrides.items()))


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from converter.errors import ConversionError  # pylint: disable=g-import-not-at-top

  try:
    run()
  except ConversionError as e:
    logging.error("conversion failed: %s", e)
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
