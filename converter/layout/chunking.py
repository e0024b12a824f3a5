"""Where a leaf's stored chunks are cut, so that a MaxText job reads each stored byte about once when it restores.

Orbax makes every host read, whole, each stored chunk its devices' shards touch (target-mesh-notes.md). MaxText
shards a leaf by the logical names of its axes (`embed`, `mlp`, `layers`, ...) through `logical_axis_rules`: on
its default mesh every `embed`-like axis goes to `fsdp`. So chunks are cut along those axes:

- the default rule cuts every axis whose logical name the default rules send to `fsdp` into a power of two of
  pieces, at most `fsdp_max`, so that any power-of-two fsdp mesh up to `fsdp_max` reads each chunk on one host;
  one layer and one expert per chunk along stacked axes; chunks kept above `min_chunk_bytes` (fewer pieces)
  and below `max_chunk_bytes` (other axes cut too);
- `--target_mesh=fsdp=64,tensor=4,expert=8` cuts each leaf into exactly its shard on that mesh under MaxText's
  default rules, layers and experts cut only where the mesh cuts them (`stage`, `expert`), so that a chunk holds
  as much of its shard as a write block does: worst case one read of each byte on that mesh, in as few reads as
  the blocks allow.

The cut is stored as zarr3 inner chunks inside the write blocks (one OCDBT value per block, as before), so
streaming and memory are unchanged, each block's chunks ordered with the mesh's axes outermost (`chunk_order`) so
that one host's part of a block is one run of bytes, which a bucket restore fetches in one request.
`predicted_amplification` and `bucket_requests` compute what a mesh reads, and in how many requests, from any
stored grid, from metadata alone.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from converter.arrays import Shape
from converter.errors import ConversionError

# MaxText 0.2.5's mesh axes (configs/base.yml `mesh_axes`), in device order.
MESH_AXES = ("data", "stage", "fsdp", "fsdp_transpose", "sequence", "context", "context_usp_ulysses", "tensor",
             "tensor_sequence", "expert", "autoregressive")
# MaxText 0.2.5's default `logical_axis_rules` for weights, in its order (configs/base.yml): flax assigns each
# axis the first rule for its name whose mesh axes no other axis of the leaf took yet.
WEIGHT_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vocab", ("tensor", "tensor_sequence", "autoregressive")),
    ("embed_vocab", ("fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert")),
    ("heads", ("tensor", "tensor_sequence", "autoregressive")),
    ("q_heads", ("tensor", "tensor_sequence", "autoregressive")),
    ("kv_heads", ("tensor", "tensor_sequence", "autoregressive")),
    ("q_lora", ("fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert")),
    ("q_lora", ("fsdp", "context", "context_usp_ulysses", "expert")),
    ("kv_lora", ("fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert")),
    ("kv_lora", ("fsdp", "context", "context_usp_ulysses", "expert")),
    ("embed_attn", ("fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert")),
    ("embed_attn", ("fsdp", "context", "context_usp_ulysses", "expert")),
    ("exp", ("expert",)),
    ("mlp_moe", ("fsdp_transpose", "tensor", "tensor_sequence", "autoregressive")),
    ("embed_moe", ("fsdp", "fsdp_transpose", "context", "context_usp_ulysses")),
    ("embed_moe", ("fsdp", "context", "context_usp_ulysses")),
    ("embed_router", ("fsdp", "fsdp_transpose", "context", "context_usp_ulysses")),
    ("embed_router", ("fsdp", "context", "context_usp_ulysses")),
    ("mlp", ("fsdp_transpose", "tensor", "tensor_sequence", "autoregressive")),
    ("gdn_head", ("fsdp_transpose", "tensor", "tensor_sequence", "autoregressive")),
    ("embed", ("fsdp", "fsdp_transpose", "context", "context_usp_ulysses", "expert")),
    ("embed", ("fsdp", "context", "context_usp_ulysses", "expert")),
    ("norm", ("tensor",)),
    ("layers", ("stage",)),
)
STACKED = ("layers", "exp")  # The default rule: one layer and one expert per chunk.
DEVICES_PER_HOST = 4


def mesh_axes(logical_axes: Sequence[str | None]) -> tuple[tuple[str, ...], ...]:
  """The mesh axes MaxText's default rules shard each axis over (flax's `logical_to_mesh_axes`)."""
  assigned: list[tuple[str, ...] | None] = [None] * len(logical_axes)
  for name, mesh in WEIGHT_RULES:
    for position, logical in enumerate(logical_axes):
      if logical == name and assigned[position] is None:
        if not any(set(mesh) & set(a or ()) for a in assigned):
          assigned[position] = mesh
        break
  return tuple(a or () for a in assigned)


def parse_mesh(text: str) -> tuple[tuple[str, int], ...]:
  """`fsdp=64,tensor=4,expert=8` (MaxText's mesh axis names) -> ((axis, size), ...) in MaxText's device order."""
  sizes: dict[str, int] = {}
  for part in (p.strip() for p in text.split(",") if p.strip()):
    axis, _, size = part.partition("=")
    if axis not in MESH_AXES:
      raise ConversionError(f"--target_mesh: unknown mesh axis {axis!r}; MaxText's are {', '.join(MESH_AXES)}")
    if not size.isdigit() or int(size) < 1 or axis in sizes:
      raise ConversionError(f"--target_mesh: {part!r} is not AXIS=SIZE with a positive size, once per axis")
    sizes[axis] = int(size)
  if not sizes:
    raise ConversionError("--target_mesh: give at least one AXIS=SIZE, e.g. fsdp=64,tensor=4")
  return tuple((axis, sizes[axis]) for axis in MESH_AXES if axis in sizes)


def _largest_power_of_two_dividing(n: int, limit: int) -> int:
  k = 1
  while k * 2 <= limit and n % (k * 2) == 0:
    k *= 2
  return k


def _smallest_divisor_above_one(n: int) -> int:
  return next((d for d in range(2, int(math.isqrt(n)) + 1) if n % d == 0), n)


@dataclasses.dataclass(frozen=True)
class ChunkRule:
  """How every leaf's chunks are cut: the default (fsdp-aligned up to `fsdp_max`) or a `target_mesh`."""

  fsdp_max: int = 64
  target_mesh: tuple[tuple[str, int], ...] = ()
  cut: bool = True  # False: no read chunks, the stored chunks are the write blocks (the layout before this rule).
  # Qwen3-30B-A3B's expert slabs at 64 pieces are 48 KiB (32 rows of 768): a 64 KiB floor would halve their
  # pieces and double what a 256-device mesh reads of them.
  min_chunk_bytes: int = 32 << 10
  max_chunk_bytes: int = 4 << 20
  # True: each chunk keeps its elements in the order of the HuggingFace tensor they came from, so that the store's
  # copy into the chunk does the kernels' transposes; every restore then undoes them while it decodes, at two to
  # three times a plain chunk's CPU (docs/loading-on-a-pod.md). Default: MaxText's order, the conversion transposes.
  huggingface_element_order: bool = False
  # With `target_mesh`: the restoring hosts' size, whose parts of each leaf are stored in databases of their own.
  devices_per_host: int = DEVICES_PER_HOST

  def chunk_shape(self, shape: Shape, logical_axes: Sequence[str | None], itemsize: int) -> Shape | None:
    """The chunk of a leaf of `shape` whose axes MaxText names `logical_axes`; it divides `shape` on every axis."""
    if not self.cut:
      return None
    if len(logical_axes) != len(shape):
      raise ValueError(f"{len(logical_axes)} logical axes for a leaf of shape {tuple(shape)}")
    if self.target_mesh:
      return self._target_chunk(shape, logical_axes)
    mapped = mesh_axes(logical_axes)
    pieces = [(_largest_power_of_two_dividing(n, self.fsdp_max) if "fsdp" in axes else 1)
              for n, axes in zip(shape, mapped)]
    chunk = [1 if name in STACKED else n // k for n, k, name in zip(shape, pieces, logical_axes)]
    while math.prod(chunk) * itemsize < self.min_chunk_bytes and max(pieces) > 1:
      axis = pieces.index(max(pieces))  # Fewer pieces on the most cut axis: still a power of two of them.
      pieces[axis] //= 2
      chunk[axis] *= 2
    uncut = [a for a, name in enumerate(logical_axes) if pieces[a] == 1 and name not in STACKED]
    while math.prod(chunk) * itemsize > self.max_chunk_bytes:
      splittable = [a for a in uncut if chunk[a] > 1 and _smallest_divisor_above_one(chunk[a]) < chunk[a]]
      if not splittable:
        break
      axis = max(splittable, key=lambda a: chunk[a])
      chunk[axis] //= _smallest_divisor_above_one(chunk[axis])
    return tuple(chunk)

  def chunk_order(self, logical_axes: Sequence[str | None]) -> tuple[int, ...] | None:
    """The order a leaf's stored chunks are laid out in (zarr3's `transpose` codec ahead of the sharding codec):
    the axes a restoring mesh cuts (`fsdp` by default; any of the target mesh's), then the rest, each group in its
    own order. Within a write block one host's shards are then one run of bytes: a bucket restore, whose reads of
    one object tensorstore merges across gaps of up to 1 MB (Orbax turns that on for buckets), reads nothing of
    other hosts' parts between them. None where that is already C order."""
    if not self.cut:
      return None
    cut = set(dict(self.target_mesh)) if self.target_mesh else {"fsdp"}
    mapped = mesh_axes(logical_axes)
    first = [a for a, axes in enumerate(mapped) if set(axes) & cut and logical_axes[a] not in STACKED]
    order = tuple(first + [a for a in range(len(logical_axes)) if a not in first])
    return None if order == tuple(range(len(order))) else order

  def _target_chunk(self, shape: Shape, logical_axes: Sequence[str | None]) -> Shape:
    """Each axis cut into the mesh's parts of it, stacked axes (layers, experts) included: the mesh names every
    axis that shards them, so a chunk may hold all the layers and experts of its shard, as a pre-sharded chunk
    does. The write blocks still bound what lies in one stored chunk (`handlers/blocks.inner_chunk_shape`)."""
    sizes = dict(self.target_mesh)
    chunk = []
    for n, axes in zip(shape, mesh_axes(logical_axes)):
      parts = math.prod(sizes.get(a, 1) for a in axes)
      chunk.append(n // parts if n % parts == 0 else n)
    return tuple(chunk)

  def host_shape(self, shape: Shape, logical_axes: Sequence[str | None]) -> Shape | None:
    """With a `target_mesh` of several hosts: the part of a leaf of `shape` that one restoring host's devices
    hold (every device's shards of it together), where every host's part is a box of that shape and the parts
    tile the leaf; None where they do not, or where every host holds the whole leaf.

    The writer stores each part apart, in stored blocks of its own of up to 16 MiB, in an OCDBT database of its
    own (handlers/host_databases.py), as Orbax's own save from that mesh stores each host's shards in its own
    files: a host restoring from a bucket then fetches its own stored blocks, about two requests each, instead of
    two for every write block its shards touch, each holding every host's part."""
    if not (self.cut and self.target_mesh) or len(logical_axes) != len(shape):
      return None
    if math.prod(n for _, n in self.target_mesh) <= self.devices_per_host:
      return None
    shard = self._target_chunk(shape, logical_axes)  # Each device's shard: one chunk of this grid.
    part = None
    for indices in _host_boxes(shape, shard, logical_axes, self.target_mesh, self.devices_per_host):
      boxes = list(indices.values())
      shards = [max(r[axis].stop for r in boxes) - min(r[axis].start for r in boxes) for axis in range(len(shape))]
      box = tuple(n * s for n, s in zip(shards, shard))
      if math.prod(shards) != len(indices) or (part is not None and box != part):
        return None  # A host's shards that are not one box, or hosts with parts of different shapes.
      part = box
    return None if part is None or part == tuple(shape) else part

  def record(self) -> dict:
    """What the conversion record keeps of the rule (readers predict amplification from it and the grids)."""
    if not self.cut:
      return {"rule": "write_blocks"}
    rule = ({"rule": "target_mesh", "target_mesh": dict(self.target_mesh), "devices_per_host": self.devices_per_host}
            if self.target_mesh else
            {"rule": "fsdp", "fsdp_max": self.fsdp_max, "min_chunk_bytes": self.min_chunk_bytes,
             "max_chunk_bytes": self.max_chunk_bytes})
    return rule | ({"element_order": "huggingface"} if self.huggingface_element_order else {})


def fsdp_mesh(devices: int) -> tuple[tuple[str, int], ...]:
  """MaxText's default mesh on `devices` devices: every one on `fsdp`."""
  return (("fsdp", devices),)


def _shard_index(coordinates: Mapping[str, int], sizes: Mapping[str, int], axes: Iterable[str]) -> tuple[int, int]:
  """(index, count) of a device's shard along a leaf axis sharded over `axes` (row-major over them)."""
  index, count = 0, 1
  for axis in axes:
    index = index * sizes.get(axis, 1) + coordinates.get(axis, 0)
    count *= sizes.get(axis, 1)
  return index, count


def _host_boxes(shape: Shape, chunk: Shape, logical_axes: Sequence[str | None], mesh: Sequence[tuple[str, int]],
                devices_per_host: int) -> Iterator[dict[tuple[int, ...], tuple[range, ...]]]:
  """For each host (of `devices_per_host` consecutive devices), its devices' distinct shard indices of a leaf and
  the box of chunk-grid ranges each one touches."""
  sizes = dict(mesh)
  names = [axis for axis, _ in mesh]
  devices = math.prod(sizes.values())
  mapped = mesh_axes(logical_axes)
  grid = [math.ceil(n / c) for n, c in zip(shape, chunk)]
  for host_start in range(0, devices, devices_per_host):
    indices: dict[tuple[int, ...], tuple[range, ...]] = {}
    for device in range(host_start, min(devices, host_start + devices_per_host)):
      coordinates = dict(zip(names, _unravel(device, [sizes[a] for a in names])))
      index, ranges = [], []
      for n, c, g, axes in zip(shape, chunk, grid, mapped):
        position, count = _shard_index(coordinates, sizes, axes)
        if count == 1 or n % count:
          index.append(0)
          ranges.append(range(g))
          continue
        extent = n // count
        index.append(position)
        ranges.append(range((position * extent) // c, min(g, ((position + 1) * extent - 1) // c + 1)))
      indices[tuple(index)] = tuple(ranges)
    yield indices


def _union(boxes: Sequence[tuple[range, ...]], measure: Callable[[tuple[range, ...]], int]) -> int:
  """`measure` of the union of a host's boxes, by inclusion-exclusion (a host has a few distinct indices):
  enumerating the chunks instead took seconds per expert leaf of a full-size DeepSeek at fsdp=256."""
  total = 0
  for k in range(1, len(boxes) + 1):
    for subset in itertools.combinations(boxes, k):
      common = tuple(range(max(r.start for r in axis), min(r.stop for r in axis)) for axis in zip(*subset))
      total += (-1) ** (k + 1) * measure(common)
  return total


def read_bytes(shape: Shape, chunk: Shape, itemsize: int, logical_axes: Sequence[str | None],
               mesh: Sequence[tuple[str, int]], devices_per_host: int = DEVICES_PER_HOST) -> tuple[int, int]:
  """(dedup, worst): the bytes all hosts read when a leaf stored in `chunk`s is restored on `mesh` (hosts of
  `devices_per_host` consecutive devices). Orbax reads each distinct shard index of a host once and decodes every
  chunk it touches whole; reads of one host share a chunk only while in flight together, so the truth lies
  between each host reading every chunk it touches once (dedup) and once per distinct index (worst)."""

  def nbytes(box: tuple[range, ...]) -> int:
    """The bytes of the chunks in a box of chunk ranges (the last chunk on an axis may be short)."""
    return math.prod(max(0, min(r.stop * c, n) - r.start * c) for r, c, n in zip(box, chunk, shape)) * itemsize

  dedup, worst = 0, 0
  for indices in _host_boxes(shape, chunk, logical_axes, mesh, devices_per_host):
    worst += sum(nbytes(box) for box in indices.values())
    dedup += _union(list(set(indices.values())), nbytes)
  return dedup, worst


def read_requests(shape: Shape, chunk: Shape, logical_axes: Sequence[str | None], mesh: Sequence[tuple[str, int]],
                  devices_per_host: int = DEVICES_PER_HOST) -> list[int]:
  """Each host's reads of a leaf stored in `chunk`s, restored on `mesh`: one ranged read per stored chunk its
  devices' shards touch (tensorstore does not merge the reads of adjacent chunks of one restore, measured in
  target-mesh-notes.md). On a bucket each is a request with its own latency and price."""
  count = lambda box: math.prod(len(r) for r in box)
  return [_union(list(set(indices.values())), count)
          for indices in _host_boxes(shape, chunk, logical_axes, mesh, devices_per_host)]


def _unravel(index: int, sizes: list[int]) -> list[int]:
  out = []
  for size in reversed(sizes):
    out.append(index % size)
    index //= size
  return list(reversed(out))


@dataclasses.dataclass(frozen=True)
class StoredLeaf:
  """What predicting a restore needs of one stored leaf: metadata only."""

  shape: Shape
  chunk: Shape
  itemsize: int
  logical_axes: Sequence[str | None]
  block: Shape | None = None  # The stored block (one value, an object's byte range) the chunks lie in; None: one.


def predicted_amplification(leaves: Sequence[StoredLeaf], mesh: Sequence[tuple[str, int]],
                            devices_per_host: int = DEVICES_PER_HOST) -> tuple[float, float]:
  """(dedup, worst) bytes all hosts read / bytes stored, restoring `leaves` on `mesh` (see `read_bytes`)."""
  stored = sum(math.prod(leaf.shape) * leaf.itemsize for leaf in leaves)
  dedup = worst = 0
  for leaf in leaves:
    d, w = read_bytes(leaf.shape, leaf.chunk, leaf.itemsize, leaf.logical_axes, mesh, devices_per_host)
    dedup, worst = dedup + d, worst + w
  return dedup / max(1, stored), worst / max(1, stored)


def _busiest(per_leaf: Iterable[list[int]]) -> int:
  """The largest of the hosts' totals, given each leaf's count per host."""
  per_host: list[int] = []
  for counts in per_leaf:
    per_host = [a + b for a, b in itertools.zip_longest(per_host, counts, fillvalue=0)]
  return max(per_host, default=0)


def predicted_requests(leaves: Sequence[StoredLeaf], mesh: Sequence[tuple[str, int]],
                       devices_per_host: int = DEVICES_PER_HOST) -> int:
  """The read calls of the busiest host restoring `leaves` on `mesh` (see `read_requests`)."""
  return _busiest(read_requests(leaf.shape, leaf.chunk, leaf.logical_axes, mesh, devices_per_host)
                  for leaf in leaves)


def bucket_requests(leaf: StoredLeaf, mesh: Sequence[tuple[str, int]],
                    devices_per_host: int = DEVICES_PER_HOST) -> list[int]:
  """About how many requests each host makes to a bucket restoring `leaf` on `mesh`. Orbax reads buckets with
  tensorstore's read coalescing on (reads of one object issued together, at most 1 MB apart, become one request):
  of each stored block its devices' shards touch, a host fetches the block's index, then its part of the block,
  one run of bytes where the block is laid out with the mesh's axes outermost (`ChunkRule.chunk_order`): two
  requests; one for a block that is a single chunk, read whole. Where each host's part of a leaf is stored
  apart (`ChunkRule.host_shape`), its stored blocks are that part's alone, so a host touches only its own.
  Measured against the GCS emulator's counts: docs/loading-on-a-pod.md."""
  block = leaf.block or leaf.chunk
  per_block = 1 if tuple(block) == tuple(leaf.chunk) else 2
  # The blocks a host touches are counted as `read_requests` counts chunks, with the blocks as the grid.
  return [per_block * blocks for blocks in read_requests(leaf.shape, block, leaf.logical_axes, mesh, devices_per_host)]


def predicted_bucket_requests(leaves: Sequence[StoredLeaf], mesh: Sequence[tuple[str, int]],
                              devices_per_host: int = DEVICES_PER_HOST) -> int:
  """The busiest host's bucket requests restoring `leaves` on `mesh` (see `bucket_requests`)."""
  return _busiest(bucket_requests(leaf, mesh, devices_per_host) for leaf in leaves)


def pre_sharded(leaves: Sequence[StoredLeaf], mesh: Sequence[tuple[str, int]]) -> list[StoredLeaf]:
  """`leaves` as a checkpoint pre-sharded for `mesh` stores them: one chunk per device shard, every layer and
  expert of the shard in it (as Orbax stores a jax.Array saved from that mesh)."""
  sizes = dict(mesh)

  def shard(leaf: StoredLeaf) -> Shape:
    parts = [math.prod(sizes.get(a, 1) for a in axes) for axes in mesh_axes(leaf.logical_axes)]
    return tuple(n // p if n % p == 0 else n for n, p in zip(leaf.shape, parts))

  return [dataclasses.replace(leaf, chunk=shard(leaf), block=None) for leaf in leaves]


def ideal_amplification(leaves: Sequence[StoredLeaf], mesh: Sequence[tuple[str, int]],
                        devices_per_host: int = DEVICES_PER_HOST) -> float:
  """What a checkpoint pre-sharded for `mesh` reads: every host exactly its devices' shards, so above 1x only by
  the leaves the mesh replicates across hosts (norms on a tensor-parallel mesh)."""
  return predicted_amplification(pre_sharded(leaves, mesh), mesh, devices_per_host)[0]


def describe_mesh(mesh: Sequence[tuple[str, int]]) -> str:
  return ",".join(f"{axis}={size}" for axis, size in mesh)


def restore_lines(leaves: Sequence[StoredLeaf], meshes: Iterable[Sequence[tuple[str, int]]],
                  devices_per_host: int = DEVICES_PER_HOST) -> list[str]:
  """One line per mesh: what its hosts would read of `leaves` when MaxText restores them, in bytes, in requests
  to a bucket and in read calls on a local disk (the busiest host's), beside a checkpoint pre-sharded for that
  mesh. A pre-sharded checkpoint's host finds its shards of a leaf adjacent in its own files: about one bucket
  request per leaf (measured 6-31 for 12 leaves, docs/loading-on-a-pod.md)."""
  lines = []
  for mesh in meshes:
    dedup, worst = predicted_amplification(leaves, mesh, devices_per_host)
    sharded = pre_sharded(leaves, mesh)
    ideal = predicted_amplification(sharded, mesh, devices_per_host)[0]
    requests = predicted_bucket_requests(leaves, mesh, devices_per_host)
    calls, ideal_calls = (predicted_requests(kind, mesh, devices_per_host) for kind in (leaves, sharded))
    lines.append(f"restore on {describe_mesh(mesh):28} reads {dedup:.2f}x the stored bytes (at worst {worst:.2f}x;"
                 f" pre-sharded for it: {ideal:.2f}x); the busiest host: about {requests:,} bucket requests"
                 f" ({requests / max(1, len(leaves)):.1f}x the pre-sharded {len(leaves):,}), {calls:,} local read"
                 f" calls ({calls / max(1, ideal_calls):.1f}x the pre-sharded {ideal_calls:,})")
  return lines


# The meshes `--dry_run` predicts restores on when no --target_mesh is given: MaxText's default (all devices on
# fsdp) at three pod sizes, hosts of 4 devices.
DEFAULT_MESHES = (fsdp_mesh(16), fsdp_mesh(64), fsdp_mesh(256))
