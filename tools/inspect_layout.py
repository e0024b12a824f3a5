"""Predicts what a MaxText restore of a converted checkpoint reads, from its metadata alone (no array data).

  bazel run //tools:inspect_layout -- --checkpoint=/ckpt/0/items --mesh=fsdp=64 --mesh=fsdp=16,tensor=4

For each mesh (MaxText's mesh axis names; hosts of --devices_per_host consecutive devices), the bytes all hosts
read under Orbax's restore (each host decodes every stored chunk its device shards touch, whole) over the bytes
stored: "dedup" when a host reads each such chunk once, "worst" when once per distinct shard index; and the
busiest host's requests to a bucket and read calls on a local disk, beside a checkpoint pre-sharded for that mesh
(converter/chunking.restore_lines). Leaves'
logical axes come from the conversion record, or for a checkpoint MaxText wrote, from converter/layout/logical_axes.py.
It also says whether every stored chunk carries a checksum.
"""

from __future__ import annotations

import os

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("checkpoint", None, "The checkpoint's items directory (OUT/0/items).")
flags.DEFINE_multi_string("mesh", ["fsdp=16", "fsdp=64", "fsdp=256"], "Meshes to predict restores on.")
flags.DEFINE_integer("devices_per_host", 4, "Devices per host (TPU v4/v5p: 4).", lower_bound=1)
flags.DEFINE_boolean("leaves", False, "Also print every leaf's shape, stored chunk and logical axes.")
flags.mark_flags_as_required(["checkpoint"])


def main(argv: list[str]) -> None:
  del argv
  from converter.layout import chunking, layout_inspection  # pylint: disable=g-import-not-at-top

  items = os.path.abspath(os.path.join(os.environ.get("BUILD_WORKING_DIRECTORY", os.getcwd()), FLAGS.checkpoint))
  leaves, record = layout_inspection.stored_leaves(items)
  if FLAGS.leaves:
    for name, leaf in leaves.items():
      print(f"{name}  {leaf.shape}  chunk {leaf.chunk}  {tuple(leaf.logical_axes)}")
  print(f"chunks: {record or 'no hf2maxtext chunking record (not written by this converter)'}")
  unchecksummed = layout_inspection.unchecksummed_leaves(items)
  if unchecksummed:
    print(f"checksums: none on {len(unchecksummed)} of {len(leaves)} leaves (e.g. {unchecksummed[0]}): a damaged"
          " stored byte there restores as a wrong value")
  else:
    print("checksums: on every stored chunk, verified by every restore")
  for line in chunking.restore_lines(list(leaves.values()), [chunking.parse_mesh(text) for text in FLAGS.mesh],
                                     FLAGS.devices_per_host):
    print(line)


if __name__ == "__main__":
  app.run(main)
