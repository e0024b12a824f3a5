"""Writes safetensors files from numpy arrays (bfloat16 included) without torch.

Used for the bundled tiny checkpoint, for benchmarks that need gigabytes of synthetic weights quickly, and by
tests that need deliberately broken files.
"""

from __future__ import annotations

import json
import struct
from typing import Mapping

import numpy as np

from converter.safetensors_reader import SAFETENSORS_DTYPES

_CODES = {dtype: code for code, dtype in SAFETENSORS_DTYPES.items()}


def safetensors_header(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> bytes:
  header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
  offset = 0
  for name, array in tensors.items():
    header[name] = {"dtype": _CODES[array.dtype], "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
    offset += array.nbytes
  raw = json.dumps(header, separators=(",", ":")).encode()
  raw += b" " * (-len(raw) % 8)
  return struct.pack("<Q", len(raw)) + raw


def write_safetensors(path: str, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> None:
  with open(path, "wb") as f:
    f.write(safetensors_header(tensors, metadata))
    for array in tensors.values():
      f.write(np.ascontiguousarray(array).tobytes())
