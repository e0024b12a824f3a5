"""The converter's transpose kernel (`converter/arrays.py`) on weight shapes, against numpy's own transposing copy
and against a plain copy of the same bytes (the floor: no transpose can move bytes faster than memory copies
them), one core, CPU seconds. Prints GB/s per shape and the ratios, then their geometric means.

  bazel run //tools:transpose_benchmark
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Sequence

import ml_dtypes
import numpy as np
from absl import app, flags

from converter import arrays

FLAGS = flags.FLAGS
flags.DEFINE_integer("rounds", 5, "Rounds of every kernel in turn per shape; medians are reported.")
flags.DEFINE_float("bytes_per_round", 3e8, "Bytes each kernel moves per round (whole repeats of the shape).")

# (rows, cols) of the source as the conversions meet them (forward: HF (out, in); reverse: MaxText (in, out)),
# with leading stacked axes where a leaf stacks experts.
SHAPES: tuple[tuple[tuple[int, ...], np.dtype], ...] = tuple(
    (shape, np.dtype(dtype)) for shape, dtype in (
        ((2048, 768), ml_dtypes.bfloat16),  # Qwen3-30B-A3B's expert, MaxText side.
        ((768, 2048), ml_dtypes.bfloat16),  # ... and HF side.
        ((2374, 2048), ml_dtypes.bfloat16),  # A 64th of a 151936 vocabulary.
        ((2048, 18992), ml_dtypes.bfloat16),  # An eighth of it, MaxText side.
        ((4096, 14336), ml_dtypes.bfloat16),  # Llama 3 8B's MLP.
        ((14336, 4096), ml_dtypes.bfloat16),
        ((1536, 7168), ml_dtypes.bfloat16),  # DeepSeek V3's q_a.
        ((8, 2048, 768), ml_dtypes.bfloat16),  # Stacked experts.
        ((2048, 128), ml_dtypes.bfloat16),
        ((2047, 771), ml_dtypes.bfloat16),  # Odd sizes.
        ((4096, 2048), np.float32),
        ((7168, 2048), ml_dtypes.float8_e4m3fn),  # An FP8 kernel kept native.
    ))


def numpy_transpose(x: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(np.swapaxes(arrays.as_bits(x), -1, -2)).view(x.dtype)


def plain_copy(x: np.ndarray) -> np.ndarray:
  return np.array(arrays.as_bits(x), copy=True).view(x.dtype)


KERNELS: tuple[tuple[str, Callable[[np.ndarray], np.ndarray]], ...] = (
    ("converter (tiles)", arrays.transpose_last_two), ("numpy", numpy_transpose), ("copy (floor)", plain_copy))


def speeds(x: np.ndarray, rounds: int, nbytes: float) -> dict[str, float]:
  """Median GB/s of each kernel on `x`, the kernels taking turns round after round (this machine drifts)."""
  repeats = max(1, int(nbytes // x.nbytes))
  expected = numpy_transpose(x)
  measured: dict[str, list[float]] = {name: [] for name, _ in KERNELS}
  for _ in range(rounds):
    for name, kernel in KERNELS:
      result = kernel(x)
      if name != "copy (floor)" and not np.array_equal(arrays.as_bits(result), arrays.as_bits(expected)):
        raise AssertionError(f"{name} transposed {x.shape} {x.dtype} wrongly")
      start = time.process_time()
      for _ in range(repeats):
        kernel(x)
      measured[name].append(x.nbytes * repeats / (time.process_time() - start) / 1e9)
  return {name: statistics.median(values) for name, values in measured.items()}


def main(argv: Sequence[str]) -> None:
  del argv
  rng = np.random.default_rng(0)
  ratios: dict[str, list[float]] = {"vs numpy": [], "of the floor": []}
  print("| shape | dtype | converter GB/s | numpy GB/s | copy GB/s | converter / numpy | converter / copy |")
  print("|---|---|---|---|---|---|---|")
  for shape, dtype in SHAPES:
    x = rng.integers(0, 256, size=shape[:-1] + (shape[-1] * dtype.itemsize,), dtype=np.uint8).view(dtype)
    result = speeds(x, FLAGS.rounds, FLAGS.bytes_per_round)
    ours, theirs, floor = (result[name] for name, _ in KERNELS)
    ratios["vs numpy"].append(ours / theirs)
    ratios["of the floor"].append(ours / floor)
    print(f"| {' x '.join(map(str, shape))} | {dtype.name} | {ours:.2f} | {theirs:.2f} | {floor:.2f} |"
          f" {ours / theirs:.2f} | {ours / floor:.2f} |", flush=True)
  geomean = lambda values: math.exp(sum(map(math.log, values)) / len(values))
  print(f"\ngeometric means: {geomean(ratios['vs numpy']):.2f}x numpy's transposing copy,"
        f" {geomean(ratios['of the floor']):.2f} of a plain copy's GB/s")


if __name__ == "__main__":
  app.run(main)
