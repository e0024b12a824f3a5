"""Writes safetensors files from numpy arrays (bfloat16 included) without torch.

Used for the bundled tiny checkpoint, for benchmarks that need gigabytes of synthetic weights quickly, and by
tests that need deliberately broken files.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from converter.reverse.safetensors_output import TensorSpec
from converter.reverse.safetensors_output import safetensors_header as _header


def safetensors_header(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> bytes:
  """The header for `tensors` written back to back in order (the converter's own builder, from arrays)."""
  return _header([TensorSpec(name, tuple(a.shape), a.dtype) for name, a in tensors.items()], metadata)


def write_safetensors(path: str, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> None:
  with open(path, "wb") as f:
    f.write(safetensors_header(tensors, metadata))
    for array in tensors.values():
      f.write(np.ascontiguousarray(array).tobytes())
