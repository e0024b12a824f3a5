"""The floors a conversion is measured against, each timed in the same run on the same machine: reading and writing
its bytes (`io_floor`, `bucket_floor`), encoding and decoding them (`compression_floors`), copying and transposing
them (`copy_floor`). No conversion that moves those bytes can beat them here. Each runs in a child process started
as the converter is (`in_child`), so that it runs with the same allocator settings as what it bounds.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

import numpy as np

from converter import write_behind
from converter.layout import chunking
from converter.planning.plan import default_zstd_level
from tools.benchmark_runner import PYTHON, child_env, files


def warm(directory: str) -> None:
  """Reads every file under `directory` into the page cache. The conversions write behind and drop what they
  wrote (converter/write_behind.py), so the checkpoint a reverse conversion reads would come from the disk,
  and its floor, run after it, from the cache: warmed first, both read it as every step reads its input."""
  buffer = bytearray(16 << 20)
  for path in files(directory):
    with open(path, "rb", buffering=0) as f:
      while f.readinto(buffer):
        pass


def _in_flight(calls, depth: int, on_result=lambda result: None) -> float:
  """Seconds to run `calls` (each starts a tensorstore operation and returns its future), `depth` at a time,
  handing each result to `on_result` in order."""
  pending = []
  start = time.monotonic()
  for call in calls:
    pending.append(call())
    if len(pending) >= depth:
      on_result(pending.pop(0).result())
  for future in pending:
    on_result(future.result())
  return time.monotonic() - start


def io_floor(files: list[str], write_bytes: int, scratch: str) -> float:
  """Seconds to read every byte of `files` and write `write_bytes` (fsync'd): no conversion that reads those
  files and writes as much can beat it on this disk. Written behind as the conversions write
  (converter/write_behind.py): plain writes into fresh page-cache pages cost up to 3x more CPU here."""
  buffer = bytearray(64 << 20)
  os.makedirs(scratch, exist_ok=True)
  out_path = os.path.join(scratch, "floor.bin")
  left = write_bytes
  start = time.monotonic()
  with write_behind.WriteBehindFile(out_path) as out:
    for path in files:
      with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
          while n and left > 0:  # Writes as much as was read, until `write_bytes`; then the rest below.
            chunk = min(n, left)
            out.write(memoryview(buffer)[:chunk])
            left -= chunk
            n -= chunk
    while left > 0:
      chunk = min(len(buffer), left)
      out.write(memoryview(buffer)[:chunk])
      left -= chunk
  seconds = time.monotonic() - start  # Closing synced the file.
  os.remove(out_path)
  return seconds


def compression_floors(input_dir: str, nbytes: int, scratch: str, share: int = 0, shares: int = 1,
                       decode: bool = True, level: int = default_zstd_level(dequantizing=False)
                       ) -> tuple[float, float | None, float, float | None]:
  """Seconds to push `nbytes` of the input's tensor bytes (repeated when the output is larger, as a dequantized
  FP8 checkpoint is) through the codec the conversions write with (zstd at `level`, the converter's default for
  the input: `plan.default_zstd_level`) in a zarr3 array on the local disk,
  through tensorstore on every core, and to read them back into a file: the other floors a conversion cannot
  beat, beside the I/O one (encoding for the conversion to MaxText, decoding for the reverse). Each takes its
  bytes from where the conversion finds them to where it leaves them: encoding reads the input files and writes
  the encoded chunks, decoding reads the chunks and writes the decoded bytes (written behind, as the reverse
  writes its safetensors). `input_dir` holds the bytes the output is made of (for a quantized checkpoint: its
  dequantized copy). With `shares`, only every `shares`-th 64 MiB piece from piece `share` on: one process's
  part of the same work (the scaling runs' control). Returns the seconds of each, and the CPU seconds (all
  threads, user + system) of each: what the same work costs the conversion's cores.

  Encoding hands tensorstore views of a file map, by reference, as the conversions hand it their blocks: a piece
  read into a fresh buffer that tensorstore then copied added the zeroing of fresh pages and two copies, which
  no conversion pays (FP8 conversions to MaxText measured below that floor; docs/benchmark-results.md). The
  array is chunked as the largest chunks the layouts store (`ChunkRule.max_chunk_bytes`): zstd's cost per byte
  depends on the chunk's size, and is near its least there (benchmarks.md)."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top

  piece, chunk = 64 << 20, chunking.ChunkRule.max_chunk_bytes
  inputs = files(input_dir, ".safetensors")
  count = len(range(share, -(-nbytes // piece), shares))
  path = os.path.join(scratch, f"compression-floor-{share}.zarr")
  shutil.rmtree(path, ignore_errors=True)
  store = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": path},
                   "metadata": {"shape": [count * piece // 2], "data_type": "uint16",
                                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk // 2]}},
                                "codecs": [{"name": "bytes"}, {"name": "zstd", "configuration": {"level": level}}]}},
                  create=True, delete_existing=True).result()

  window = lambda i: store[i * (piece // 2):(i + 1) * (piece // 2)]
  cpu_start = time.process_time()
  with write_behind.WriteBehindDirectory(path, data_dirs=("c",)):  # zarr3's chunk files, as the conversions' own.
    pieces = enumerate(floor_pieces(inputs, count, piece, share, shares))
    encode = _in_flight((lambda i=i, values=values: window(i).write(values, can_reference_source_data_indefinitely=True)
                         for i, values in pieces), 4)
  encode_cpu = time.process_time() - cpu_start
  if not decode:
    shutil.rmtree(path, ignore_errors=True)
    return encode, None, encode_cpu, None
  warm(path)  # Written behind, hence dropped: read back from the cache, as the reverse reads its checkpoint.
  decoded_path = os.path.join(scratch, f"decompression-floor-{share}.bin")
  start, cpu_start = time.monotonic(), time.process_time()
  with write_behind.WriteBehindFile(decoded_path) as decoded:
    _in_flight((lambda i=i: window(i).read() for i in range(count)), 4, decoded.write)
  decoded_seconds = time.monotonic() - start  # Closing synced the file.
  decode_cpu = time.process_time() - cpu_start
  os.remove(decoded_path)
  shutil.rmtree(path, ignore_errors=True)
  return encode, decoded_seconds, encode_cpu, decode_cpu


def decode_floor(input_dir: str, nbytes: int, level: int = default_zstd_level(dequantizing=False)) -> float:
  """Seconds to decode `nbytes` of the input's bytes, held in memory as the conversions encode them (zstd at
  `level`, the largest chunks a layout stores), by tensorstore on every core: what a restore of that many bytes
  cannot beat however its chunks lie. Memory on both sides, so that nothing of the read floor is counted twice:
  64 MiB pieces, one in flight per core, each decoded into a buffer of its slot that an untimed first pass has
  already faulted in, since a restore's own output arrays are the copy floor's (the decoded bytes are checked
  against the input's in that pass: a floor that skipped work would be no floor). One read of the whole array
  instead left most cores idle behind its single output (a restore beat that "floor")."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top

  piece, chunk = 64 << 20, chunking.ChunkRule.max_chunk_bytes
  count = -(-nbytes // piece)
  store = ts.open({"driver": "zarr3", "kvstore": {"driver": "memory"},
                   "metadata": {"shape": [count * piece // 2], "data_type": "uint16",
                                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunk // 2]}},
                                "codecs": [{"name": "bytes"}, {"name": "zstd", "configuration": {"level": level}}]}},
                  create=True).result()
  window = lambda i: store[i * (piece // 2):(i + 1) * (piece // 2)]
  pieces = list(floor_pieces(files(input_dir, ".safetensors"), count, piece))
  _in_flight((lambda i=i, values=values: window(i).write(values) for i, values in enumerate(pieces)), 4)
  depth = min(count, os.cpu_count() or 1)
  slots = [np.empty(piece // 2, np.uint16) for _ in range(depth)]
  decode = lambda i: ts.array(slots[i % depth]).write(window(i))
  for i, values in enumerate(pieces):
    decode(i).result()
    if not np.array_equal(slots[i % depth], values):
      raise AssertionError(f"decode floor: piece {i} decoded to other bytes than the input's")
  return _in_flight((lambda i=i: decode(i) for i in range(count)), depth)


def copy_floor(input_dir: str, nbytes: int) -> tuple[float, float]:
  """Seconds and CPU seconds to copy `nbytes` of the input's bytes, warm in the page cache, into a buffer once:
  what the bytes a conversion must transpose would cost it if a transpose were a plain copy. The codec floor plus
  this is the transpose floor, the least a conversion that reorders axes can cost (issue 38)."""
  piece = 64 << 20
  count = -(-nbytes // piece)
  inputs = files(input_dir, ".safetensors")
  warm(input_dir)  # The conversions find their input in the cache too (the floors before them read it).
  buffer = np.empty(piece // 2, np.uint16)
  start, cpu_start = time.monotonic(), time.process_time()
  for values in floor_pieces(inputs, count, piece):
    np.copyto(buffer, values)
  return time.monotonic() - start, time.process_time() - cpu_start


def floor_pieces(files: Sequence[str], count: int, piece: int, share: int = 0,
                 shares: int = 1) -> Iterator[np.ndarray]:
  """`count` pieces of `piece` bytes (as uint16) of `files`' bytes, each file cut from its start and its last piece
  padded with zeros, the files taken again from the first while more are asked for; with `shares`, only every
  `shares`-th piece from piece `share` on. Whole pieces are views of a read-only file map, not copies."""
  left, number = count, 0
  while left:
    for name in files:
      size = os.path.getsize(name)
      if not size:
        continue
      with open(name, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
      for offset in range(0, size, piece):
        number += 1
        if (number - 1) % shares != share:
          continue
        if not left:
          return
        left -= 1
        if offset + piece <= size:
          yield np.frombuffer(mapped, np.uint16, count=piece // 2, offset=offset)
        else:
          values = np.zeros(piece // 2, np.uint16)
          values.view(np.uint8)[:size - offset] = np.frombuffer(mapped, np.uint8, offset=offset)
          yield values
    if not number:
      raise ValueError(f"no bytes to encode in {list(files)}")


def child_command(function, *args) -> list[str]:
  """A command running `function(*args)` (a function of this module) in a child process started the way the
  conversions are (`PYTHON`, malloc configured as the converter configures it), printing its result as JSON:
  a floor then runs with the same allocator settings as what it bounds (glibc's huge pages for malloc, set by
  the launcher, take the compression floor from 3.9 to 2.6 s here). Run it with `child_env()`."""
  code = ("import json, sys; from converter import malloc; malloc.configure(); from tools import floors;"
          f" print(json.dumps(floors.{function.__name__}(*json.loads(sys.argv[1]))))")
  return [PYTHON, "-c", code, json.dumps(args)]


def in_child(function, *args):
  """`function(*args)` in a child process (`child_command`); returns its result."""
  os.sync()  # As before every conversion (run_sampled).
  result = subprocess.run(child_command(function, *args), env=child_env(), capture_output=True, text=True)
  if result.returncode:
    sys.exit(f"{function.__name__} failed:\n{result.stderr[-3000:]}")
  return json.loads(result.stdout.strip().splitlines()[-1])


def bucket_floor(remote_dir: str, names: list[str], scratch: str) -> tuple[float, float]:
  """Seconds to read every byte of `remote_dir`'s objects `names` in 64 MiB ranges, and to write as many bytes as
  64 MiB objects under `scratch` (deleted after), through tensorstore's kvstore with 8 requests in flight: the
  bucket's own floor, as io_floor is the disk's."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  from converter import storage  # pylint: disable=g-import-not-at-top

  _, bucket, base = storage.split_bucket(remote_dir)
  store = ts.KvStore.open({"driver": "gcs", "bucket": bucket}).result()
  piece = 64 << 20
  ranges = []
  for name in names:
    size = storage.size(f"{remote_dir}/{name}")
    ranges += [(f"{base}/{name}", a, min(a + piece, size)) for a in range(0, size, piece)]
  total = sum(b - a for _, a, b in ranges)

  read = _in_flight((lambda k=k, a=a, b=b: store.read(k, byte_range=slice(a, b)) for k, a, b in ranges), 8)
  block = os.urandom(piece)
  _, _, scratch_base = storage.split_bucket(scratch)
  count = -(-total // piece)
  write = _in_flight((lambda i=i: store.write(f"{scratch_base}/{i:06d}", block) for i in range(count)), 8)
  _in_flight((lambda i=i: store.write(f"{scratch_base}/{i:06d}", None) for i in range(count)), 8)
  return read, write
