"""Where the writer cuts each lazy tensor into blocks, and the grid it stores them in: read by the writer
(handlers/streaming.py), and by whatever must know its blocks before a save starts (the converter's dry run and
its early reads), without loading Orbax or JAX."""

from __future__ import annotations

import itertools
import math
from typing import Iterator, NamedTuple, Sequence

from handlers.lazy_tensor import Index, LazyTensor, block_indices

# Below glibc's largest mmap threshold (32 MiB): a larger block is always a fresh mapping the kernel zeroes page by
# page before it is filled, and so is the chunk tensorstore decodes it into when it is read back; smaller ones
# are reused from the heap once freed.
TARGET_BLOCK_BYTES = 16 << 20


def _largest_divisor_at_most(n: int, limit: int) -> int:
  return max(d for d in range(1, max(1, min(n, limit)) + 1) if n % d == 0)


def write_block_shape(lazy: LazyTensor, target_bytes: int = TARGET_BLOCK_BYTES) -> tuple[int, ...]:
  """The loader's natural blocks, grouped along stacked axes up to about `target_bytes` per write.

  A natural block can be tiny (one expert of one layer), and every tensorstore write is a durable OCDBT commit,
  so writing them one by one is slow. Axes are grown outermost first, by whole divisors, so the blocks still
  tile the array exactly and a scanned MoE leaf (experts, layers, ...) is grouped by experts within one layer
  before it spans layers: a reader taking one layer at a time (the reverse conversion) decodes little else.
  """
  block = list(lazy.block_shape)
  for axis in range(len(block)):
    if block[axis] == lazy.shape[axis] or lazy.shape[axis] % block[axis]:
      continue
    block_bytes = math.prod(block) * lazy.itemsize
    factor = _largest_divisor_at_most(lazy.shape[axis] // block[axis], target_bytes // max(1, block_bytes))
    block[axis] *= factor
  return _aligned_to_device_shards(lazy, _aligned_to_host_parts(lazy, _aligned_to_chunks(lazy, block)))


def _aligned_to_chunks(lazy: LazyTensor, block: list[int]) -> list[int]:
  """Blocks made of whole read chunks (`lazy.chunk_shape`), so that the chunks can be stored inside them: a block
  longer than a chunk is cut to a multiple of it, a shorter one to the largest divisor of it that keeps at least a
  quarter of the block (a 1365-row slab of 6144 rows becomes 1024 rows, which a reader's shards also divide); a
  chunk with no such divisor (a 151681-row vocabulary) keeps the block, which `inner_chunk_shape` then follows."""
  if lazy.chunk_shape is None:
    return block
  for axis, (b, c) in enumerate(zip(block, lazy.chunk_shape)):
    if b % c and b != lazy.shape[axis]:
      block[axis] = _fitted(b, c)
  return block


def _fitted(length: int, unit: int) -> int:
  """A block's `length` along an axis cut into `unit`s: a multiple of the unit where longer, else a divisor of it
  that keeps at least a quarter of the length, else the length as it is."""
  if length > unit:
    return unit * (length // unit)
  divisor = _largest_divisor_at_most(unit, length)
  return divisor if 4 * divisor >= length else length


def _aligned_to_host_parts(lazy: LazyTensor, block: list[int]) -> list[int]:
  """Blocks that straddle restoring hosts' parts (`lazy.host_shape`) are written in uneven pieces, stored as
  their common divisor (a 1280-row slab of 512-row parts: 256 rows): along an axis the parts cut, a block longer
  than a part is cut to a multiple of it, a shorter one to a divisor of it that keeps at least a quarter of it."""
  if lazy.host_shape is None:
    return block
  for axis, (b, h) in enumerate(zip(block, lazy.host_shape)):
    if h != lazy.shape[axis] and b % h and h % b:
      block[axis] = _fitted(b, h)
  return block


def inner_chunk_shape(lazy: LazyTensor, write: tuple[int, ...]) -> tuple[int, ...] | None:
  """The zarr3 inner chunk stored inside each write block (zarr3 inner chunks must divide their shard): the read
  chunk where the block holds it whole, else their largest common part, else (when that part would be tiny: a
  prime vocabulary against a slab of rows) the block's own extent on that axis."""
  if lazy.chunk_shape is None:
    return None
  inner = []
  for c, w in zip(lazy.chunk_shape, write):
    common = math.gcd(c, w)
    inner.append(common if 4 * common >= min(c, w) else w)
  return tuple(inner)


def _aligned_to_device_shards(lazy: LazyTensor, block: list[int]) -> tuple[int, ...]:
  """Blocks that straddle device shards make the stored grid (their gcd with the shards, see `write_shape`)
  needlessly fine: a 4681-row slab of a 16384-row table sharded 1024 rows a device would be stored one row per
  zarr shard. Along a sharded axis the loader reads partially (its block is not the whole axis), a block is
  therefore cut to the largest divisor of the device shard that keeps at least a quarter of it. A leaf with read
  chunks (`chunk_shape`) keeps its blocks: see `write_shape`."""
  sharding = getattr(lazy, "sharding", None)
  if sharding is None or lazy.chunk_shape is not None:
    return tuple(block)
  for axis, (size, shard) in enumerate(zip(lazy.shape, sharding.shard_shape(lazy.shape))):
    b = block[axis]
    if b != size and shard != size and shard % b and b % shard:
      block[axis] = _fitted(b, shard)
  return tuple(block)


def write_shape(lazy: LazyTensor, block: tuple[int, ...], scale: tuple[int, ...] | None = None) -> tuple[int, ...]:
  """The stored array's shard grid: the write blocks, split further along a device sharding if any.

  Orbax stores a sharded jax.Array with one zarr shard per device shard. Matching that exactly would need a
  whole device shard in memory (1/16 of a 150 GB leaf is still 9 GB), so each device shard is instead made of
  whole zarr shards no larger than a loader block: readers see the same array, restored per device without
  reading across shard boundaries.

  A leaf with read chunks (`chunk_shape`, cut for the restoring mesh) is not cut at the simulated devices' shards:
  its readers read chunks, not blocks, and those shards (along the first axis they divide) would make stored
  blocks of a few hundred KiB along the wrong axis, between which a bucket restore, merging one host's reads of
  one object up to 1 MB apart, fetches the other hosts' parts too (measured: docs/loading-on-a-pod.md).
  """
  if lazy.host_shape is not None:  # Each host's piece of a group of blocks (`host_group`'s `scale`).
    return tuple(math.gcd(b, h) * k for b, h, k in zip(block, lazy.host_shape, scale or (1,) * len(block)))
  sharding = getattr(lazy, "sharding", None)
  if sharding is None or lazy.chunk_shape is not None:
    return block
  shards = sharding.shard_shape(lazy.shape)
  # An unsharded axis keeps the block (its last one may be short); a sharded one is cut at device shards.
  return tuple(b if s == d else math.gcd(b, s) for b, s, d in zip(block, shards, lazy.shape))


class HostGroup(NamedTuple):
  """Blocks whose pieces are stored together (`host_group`)."""

  scale: tuple[int, ...]  # How many blocks along each axis one stored block spans.
  blocks: int  # How many consecutive blocks (C order) hold whole stored blocks: one transaction's worth.


def host_group(lazy: LazyTensor, block: tuple[int, ...], max_inflight_bytes: int) -> HostGroup:
  """The blocks one stored block of a host's part spans (`write_shape`). A block's pieces are a host's share of
  it (a quarter on 4 hosts), and a restore from a bucket pays about two requests per stored block a host reads,
  so the pieces of several blocks are stored as one, up to TARGET_BLOCK_BYTES. The writer stages each group of
  blocks, which follow one another, in one transaction (handlers/host_databases.py): at most half the budget.
  Axes are taken from the last, as blocks follow one another: an axis the hosts' parts cut is taken whole (its
  blocks go to different parts' stored blocks), another is joined up to those limits; the first joined only in
  part, or with a short last block, ends it."""
  scale = [1] * len(block)
  if lazy.host_shape is None:
    return HostGroup(tuple(scale), 1)
  block_bytes = math.prod(block) * lazy.itemsize
  piece_bytes = math.prod(math.gcd(b, h) for b, h in zip(block, lazy.host_shape)) * lazy.itemsize
  blocks_left = max(1, (max_inflight_bytes // 2) // max(1, block_bytes))
  pieces_left = max(1, TARGET_BLOCK_BYTES // max(1, piece_bytes))
  blocks = 1
  for axis in reversed(range(len(block))):
    count = -(-lazy.shape[axis] // block[axis])
    if count == 1:
      continue
    if lazy.host_shape[axis] != lazy.shape[axis]:
      if count > blocks_left:
        break
      blocks, blocks_left = blocks * count, blocks_left // count
      continue
    if lazy.shape[axis] % block[axis]:
      break
    scale[axis] = _largest_divisor_at_most(count, min(blocks_left, pieces_left))
    blocks, blocks_left, pieces_left = blocks * scale[axis], blocks_left // scale[axis], pieces_left // scale[axis]
    if scale[axis] < count:
      break
  if scale == [1] * len(block):
    return HostGroup(tuple(scale), 1)  # Nothing joined: each block's pieces stored alone.
  return HostGroup(tuple(scale), blocks)


def host_parts(lazy: LazyTensor, index: Index) -> list[tuple[int, Index]]:
  """The pieces of the write block `index` in each restoring host's part of `lazy` (`lazy.host_shape`), each with
  its part's number (C order over the parts' grid); the whole block as part 0 where `lazy` has no such parts."""
  if lazy.host_shape is None:
    return [(0, index)]
  grid = [n // h for n, h in zip(lazy.shape, lazy.host_shape)]
  pieces = []
  for piece in itertools.product(*[
      [slice(max(s.start, p * h), min(s.stop, (p + 1) * h)) for p in range(s.start // h, (s.stop - 1) // h + 1)]
      for s, h in zip(index, lazy.host_shape)]):
    number = 0
    for s, h, g in zip(piece, lazy.host_shape, grid):
      number = number * g + s.start // h
    pieces.append((number, piece))
  return pieces


def block_target_bytes(max_inflight_bytes: int) -> int:
  """About how large a write block is under a byte budget: several blocks in flight keep both cores and the disk
  busy, so a small budget makes small blocks."""
  return min(TARGET_BLOCK_BYTES, max_inflight_bytes // 4)


def write_order(leaf_bytes: Sequence[int]) -> list[int]:
  """The order the writer takes leaves in, given each leaf's bytes in the tree's order: smallest first, ties in
  the tree's order.

  A giant model's bytes are nearly all in its few largest leaves (a DeepSeek-V3's three routed-expert kernels hold
  96% of them): every other kind of leaf, each with its own reads and resident memory, is written in the first
  minutes, so the highest memory a conversion reaches shows early, not after an hour, and the rest of the run is
  one kind of leaf whose memory, flat or not, says whether anything grows with the bytes written."""
  return sorted(range(len(leaf_bytes)), key=leaf_bytes.__getitem__)


def plan_blocks(values: Sequence[LazyTensor], target_bytes: int = TARGET_BLOCK_BYTES):
  """Each value's block shape (`write_block_shape`); every block as (value's position, index), in the order the
  writer writes them (`write_order`); and each of those blocks' bytes."""
  blocks = [write_block_shape(lazy, target_bytes) for lazy in values]
  located = [(leaf, index) for leaf in write_order([lazy.nbytes for lazy in values])
             for index in block_indices(values[leaf].shape, blocks[leaf])]
  sizes = [region_bytes(values[leaf], index) for leaf, index in located]
  return blocks, located, sizes


def blocks_in_order(values: Sequence[LazyTensor], target_bytes: int = TARGET_BLOCK_BYTES
                    ) -> Iterator[tuple[LazyTensor, Index, int]]:
  """`plan_blocks`' blocks in the same order, each with its value and bytes, cut one value at a time as they are
  asked for: the first blocks of a large tree without planning the rest."""
  for leaf in write_order([lazy.nbytes for lazy in values]):
    lazy = values[leaf]
    for index in block_indices(lazy.shape, write_block_shape(lazy, target_bytes)):
      yield lazy, index, region_bytes(lazy, index)


def region_bytes(lazy: LazyTensor, index: Index) -> int:
  """The bytes of `lazy`'s region `index`."""
  return math.prod(s.stop - s.start for s in index) * lazy.itemsize
