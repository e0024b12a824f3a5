"""An existing checkpoint's stored layout, as converter/layout/chunking.py predicts restores from: every leaf's shape,
stored (read) chunk and MaxText logical axes, and whether its chunks carry checksums, from metadata alone."""

from __future__ import annotations

from converter.layout import chunking, logical_axes
from converter.sources.checkpoint_reader import CheckpointReader
from converter.checkpoint_format.record import ConversionRecord, leaf_name


def _axes_from_name(name: str, rank: int) -> tuple[str | None, ...] | None:
  """A checkpoint without a record (MaxText's own): the leaf's axes from its name, a scanned leaf's layer axis
  at 1 (MaxText's `param_scan_axis`)."""
  if "/layers/" in f"/{name}/" and (unstacked := logical_axes.per_layer(name, rank - 1)) is not None:
    return logical_axes.stacked(unstacked, 1, ("layers",))
  return logical_axes.per_layer(name, rank)


def stored_leaves(items_path: str) -> tuple[dict[str, chunking.StoredLeaf], dict | None]:
  """{leaf path under params/params: its stored layout}, and the chunking rule the checkpoint records."""
  record = ConversionRecord.read(items_path)
  recorded = record.logical_axes or {}
  reader = CheckpointReader(items_path)
  leaves = {}
  for key, array in sorted(reader.arrays.items()):
    name = leaf_name(key)
    axes = recorded[name] if name in recorded else _axes_from_name(name, len(array.shape))
    leaves[name] = chunking.StoredLeaf(array.shape, reader.chunk_shape(array), array.dtype.itemsize,
                                       tuple(axes) if axes is not None else (None,) * len(array.shape),
                                       reader.block_shape(array))
  return leaves, record.chunking


def unchecksummed_leaves(items_path: str) -> list[str]:
  """The leaves whose stored chunks carry no checksum a restore verifies (written before this converter added
  them, by another writer, or with --nochunk_checksums): a damaged byte there restores as a wrong value."""
  reader = CheckpointReader(items_path)
  return [leaf_name(key) for key, array in sorted(reader.arrays.items()) if reader.chunk_checksum(array) is None]
