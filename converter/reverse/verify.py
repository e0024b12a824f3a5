"""`--verify` on the way back: the written safetensors re-read and compared with what the checkpoint gives.

Every piece the writer wrote (one tensor, one expert of a tensor holding every expert, or a slab of rows of a
large one) is computed again from the checkpoint through the same reads and inverse ops (to_huggingface.ReadAhead,
under the same byte budget), and compared bit for bit with the bytes at its place in the written file, one piece
at a time: the reverse's float ops (a query scale undone, Gemma's `w + 1`) are part of what is recomputed, so the
comparison is exact everywhere. Each file's header is parsed and checked against the plan (names, dtypes, shapes,
offsets), and the index against the plan's shards. What it catches: a storage fault, a short or misplaced write,
a bug in the write path; not a wrong inverse the writer shares (roundtrip_test pins those to the original).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Callable

import numpy as np

from converter import storage
from converter.errors import ConversionError
from converter.options import ReverseOptions
from converter.reverse.reverse_plan import HfTensor
from converter.reverse.safetensors_output import INDEX_FILE
from converter.reverse.to_huggingface import OpenLeaves, ReadAhead, ToHuggingFaceResult
from converter.sources.safetensors import TensorInfo, read_header


@dataclasses.dataclass(frozen=True)
class VerifyReport:
  tensors: int
  bytes: int
  mismatches: tuple[str, ...]


def _first_difference(got: bytes, expected: np.ndarray) -> str:
  """Where the written bytes of a piece first differ from its expected value (NaN payloads included)."""
  raw = np.dtype(f"u{expected.dtype.itemsize}")
  stored = np.frombuffer(got, raw).reshape(expected.shape) if len(got) == expected.nbytes else None
  if stored is None:
    return f"{len(got)} bytes written where {expected.nbytes} were expected"
  differing = np.argwhere(stored != np.ascontiguousarray(expected).view(raw))
  return f"{len(differing)} differing values, first at {tuple(int(i) for i in differing[0])}"


def _header_mismatches(path: str, shard: tuple[HfTensor, ...]) -> tuple[dict[str, TensorInfo], list[str]]:
  try:
    header = read_header(path)
  except ConversionError as e:
    return {}, [f"{path}: unreadable: {e}"]
  mismatches = []
  expected = [(t.name, t.shape, t.dtype) for t in shard]
  written = [(info.name, info.shape, info.dtype) for info in sorted(header.values(), key=lambda i: i.begin)]
  if written != expected:
    wrong = next((w, e) for w, e in itertools.zip_longest(written, expected) if w != e)
    mismatches.append(f"{path}: header holds {len(written)} tensors, the plan {len(expected)}; first difference:"
                      f" written {wrong[0]}, planned {wrong[1]}")
  return header, mismatches


def _index_mismatches(result: ToHuggingFaceResult) -> list[str]:
  if len(result.files) == 1:
    return []
  path = storage.join(result.output_dir, INDEX_FILE)
  planned = {t.name: name for name, shard in zip(result.files, result.shards) for t in shard}
  try:
    weight_map = json.loads(storage.read_text(path)).get("weight_map")
  except (OSError, ValueError, AttributeError) as e:
    return [f"{path}: unreadable: {e}"]
  if weight_map != planned:
    wrong = sorted(n for n in set(planned) | set(weight_map or {}) if (weight_map or {}).get(n) != planned.get(n))
    return [f"{path}: weight_map differs from the plan for {len(wrong)} tensors, e.g. {wrong[0]}"]
  return []


def verify_written(result: ToHuggingFaceResult, options: ReverseOptions,
                   on_piece: Callable[[int], None] | None = None) -> VerifyReport:
  """Compares the files this process wrote (result.written_files) with the checkpoint, piece by piece."""
  from converter.sources.checkpoint_reader import CheckpointReader  # pylint: disable=g-import-not-at-top

  mine = [(name, shard) for name, shard in zip(result.files, result.shards) if name in result.written_files]
  mismatches = _index_mismatches(result) if result.written_files == result.files else []
  headers = {}
  for name, shard in mine:
    headers[name], wrong = _header_mismatches(storage.join(result.output_dir, name), shard)
    mismatches += wrong
  reader = CheckpointReader(result.plan.items_path, dequantize_fp8=True)
  items = [(name, tensor, parts) for name, shard in mine for tensor in shard for parts in tensor.pieces]
  pieces = ReadAhead([(tensor, parts) for _, tensor, parts in items],
                     OpenLeaves(reader, options.read_cache_bytes), options.read_ahead_bytes, result.merge)
  tensors = total = 0
  offset = 0  # Into the current tensor's bytes.
  failed: set[str] = set()
  try:
    for (name, _, _), (tensor, value) in zip(items, pieces):
      info = headers[name].get(tensor.name)
      start = offset
      offset = 0 if not tensor.in_pieces or start + value.nbytes >= tensor.nbytes else start + value.nbytes
      if info is None or tensor.name in failed:
        continue
      got = storage.read_bytes(info.path, info.begin + start, info.begin + start + value.nbytes)
      if got != np.ascontiguousarray(value).tobytes():
        failed.add(tensor.name)
        mismatches.append(f"{tensor.name} in {name} (from {'/'.join(tensor.pieces[0][0].leaf)}), bytes"
                          f" {start}..{start + value.nbytes}: {_first_difference(got, value)}")
        continue
      total += value.nbytes
      tensors += offset == 0
      if on_piece is not None:
        on_piece(value.nbytes)
  finally:
    pieces.close()
  return VerifyReport(tensors, total, tuple(mismatches))
