"""Validates a converted checkpoint: its logits against transformers on the same token ids.

  bazel run //tools:validate -- --hf_model_path=/models/Qwen3-8B --checkpoint=/ckpt/qwen3-8b/0/items

Restores through Orbax v0 and v1 as numpy (they must agree bit for bit), runs a float32 forward pass with MaxText's
semantics on the MaxText-layout tree on the host's CPU, and exits non-zero below the thresholds. It also restores
the checkpoint as MaxText does, through v0 and v1 onto every device of JAX's default backend (sharded on fsdp),
which must equal the numpy restore bit for bit; on an accelerator host (a TPU VM, a GPU machine) the forward pass
runs there too, from that restore, and must meet the family's bound against the CPU's (validate_lib.py,
ACCELERATOR_THRESHOLDS). JAX_PLATFORMS=cpu keeps it on the CPU alone.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("hf_model_path", None, "The HF checkpoint the conversion started from.")
flags.DEFINE_string("checkpoint", None, "The converted checkpoint's items directory (OUT/0/items).")
flags.DEFINE_integer("batch", 2, "Sequences of random token ids.")
flags.DEFINE_integer("seq_len", 32, "Tokens per sequence.")
flags.DEFINE_integer("seed", 0, "Seed of the token ids.")
flags.DEFINE_float("max_abs_diff", 1e-4, "Largest allowed |logit difference|.")
flags.DEFINE_float("min_cosine", 0.99999, "Smallest allowed cosine similarity of the logits.")
flags.DEFINE_float("min_argmax_agreement", 1.0, "Smallest allowed fraction of positions with the same argmax.")
flags.mark_flags_as_required(["hf_model_path", "checkpoint"])


def _resolve(path: str) -> str:
  return os.path.abspath(os.path.join(os.environ.get("BUILD_WORKING_DIRECTORY", os.getcwd()), path))


def main(argv: list[str]) -> None:
  del argv
  from tools import validate_lib  # pylint: disable=g-import-not-at-top

  report = validate_lib.validate(
      _resolve(FLAGS.hf_model_path), _resolve(FLAGS.checkpoint), batch=FLAGS.batch, seq_len=FLAGS.seq_len,
      seed=FLAGS.seed,
  )
  thresholds = validate_lib.Thresholds(FLAGS.max_abs_diff, FLAGS.min_cosine, FLAGS.min_argmax_agreement)
  print(f"leaves:           {report.leaves}")
  print(f"v0 == v1 restore: {report.v0_v1_identical}")
  print(f"max|diff|:        {report.max_abs_diff:.3e}")
  print(f"cosine:           {report.cosine:.8f}")
  print(f"argmax agreement: {report.argmax_agreement * 100:.2f}%")
  restored = "; ".join(report.device_restore_failures) or "v0 and v1 (sharded on fsdp) equal the numpy restore"
  print(f"{report.platform + ' restore:':<18}{restored}")
  if report.accelerator is not None:
    compared, bound = report.accelerator, report.accelerator.thresholds
    print(f"{report.platform + ' forward:':<18}against the CPU's: max|diff| {compared.max_abs_diff:.3e}"
          f" (<= {bound.max_abs_diff:.3g}), cosine {compared.cosine:.8f} (>= {bound.min_cosine}),"
          f" argmax agreement {compared.argmax_agreement * 100:.2f}% (>= {bound.min_argmax_agreement * 100:.0f}%)")
  failures = report.failures(thresholds)
  if failures:
    print("FAILED: " + "; ".join(failures), file=sys.stderr)
    sys.exit(1)
  print("PASSED")


if __name__ == "__main__":
  app.run(main)
