"""Stored chunks laid out for the restoring mesh (converter/layout/chunking.py): the grids the rule asks for are what is
stored, restores through Orbax v0 and v1 read the same values (and logits) as before, the reverse direction gives
the checkpoint back bit for bit, and the predicted read amplification is 1x where the layout promises it.

The tiny models' leaves are below the default rule's 32 KiB chunk floor, so the default layout is checked with the
floor lowered (in-process, through the library call) and `--target_mesh` (which has no floor) through the binary.
"""

from __future__ import annotations

import os

from absl.testing import absltest

from integration_tests import harness

harness.start_jax()

from converter import conversion  # pylint: disable=g-import-not-at-top
from converter.reverse import to_huggingface  # pylint: disable=g-import-not-at-top
from converter.layout import chunking, layout_inspection
from converter.options import PlanOptions, ReverseOptions, SaveOptions  # pylint: disable=g-import-not-at-top
from converter.checkpoint_format.record import ConversionRecord  # pylint: disable=g-import-not-at-top
from tools import checkpoint_io, validate_lib  # pylint: disable=g-import-not-at-top
from tools.testing import tiny_models

MESH = "fsdp=4,tensor=2,expert=2"

THRESHOLDS = validate_lib.Thresholds()  # The float32 bar (its defaults).


class ChunkLayoutTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model_dir = tiny_models.build_tiny_model("qwen3_moe", harness.scratch_dir("qwen3-moe-hf-"))
    cls.target = harness.converted(cls.model_dir, "--save_dtype=float32", f"--target_mesh={MESH}",
                                   "--simulated_cpu_devices_count=16")
    cls.fine = os.path.join(harness.scratch_dir("fine-"), "out")
    rule = chunking.ChunkRule(fsdp_max=64, min_chunk_bytes=1024)
    cls.fine = conversion.convert_to_maxtext(cls.model_dir, cls.fine, PlanOptions(save_dtype="float32", chunking=rule),
                                             SaveOptions(devices=1)).items_path

  def test_target_mesh_chunks_are_its_shards_and_read_once(self):
    rule = chunking.ChunkRule(target_mesh=chunking.parse_mesh(MESH))
    record = ConversionRecord.read(self.target)
    self.assertEqual(record.chunking, rule.record())
    leaves, _ = layout_inspection.stored_leaves(self.target)
    cut_below_block = 0
    for name, leaf in leaves.items():
      wanted = rule.chunk_shape(leaf.shape, leaf.logical_axes, leaf.itemsize)
      # The shards' chunks, cut further only where the 16 simulated devices' own shards are smaller.
      self.assertTrue(all(w % c == 0 for w, c in zip(wanted, leaf.chunk)), (name, wanted, leaf.chunk))
      cut_below_block += leaf.chunk != leaf.shape
    self.assertGreater(cut_below_block, 10)
    # Read once, as a checkpoint pre-sharded for the mesh is: above 1x only by the norms every host needs whole.
    dedup, worst = chunking.predicted_amplification(list(leaves.values()), rule.target_mesh)
    self.assertEqual((dedup, worst), (chunking.ideal_amplification(list(leaves.values()), rule.target_mesh),) * 2)
    self.assertLess(dedup, 1.01)

  def test_target_mesh_stores_each_hosts_part_apart(self):
    # 16 devices, hosts of 4: each host's part of a leaf in stored blocks of its own, in databases of their own.
    rule = chunking.ChunkRule(target_mesh=chunking.parse_mesh(MESH))
    databases = [name for name in os.listdir(self.target) if name.startswith("ocdbt.process_0p")]
    self.assertGreater(len(databases), 1)
    leaves, _ = layout_inspection.stored_leaves(self.target)
    parted = 0
    for name, leaf in leaves.items():
      host = rule.host_shape(leaf.shape, leaf.logical_axes)
      if host is not None:
        self.assertTrue(all(h % b == 0 for h, b in zip(host, leaf.block)), (name, host, leaf.block))
        parted += 1
    self.assertGreater(parted, 5)

  def test_default_layout_is_read_once_on_fsdp_meshes(self):
    leaves, record = layout_inspection.stored_leaves(self.fine)
    self.assertEqual(record["rule"], "fsdp")
    for devices in (16, 64):
      dedup, _ = chunking.predicted_amplification(list(leaves.values()), chunking.fsdp_mesh(devices))
      self.assertLessEqual(dedup, 1.05, devices)
    # The layout before it: one chunk per write block, no cut along embed axes.
    whole = [chunking.StoredLeaf(l.shape, l.shape[:1] + (1,) + l.shape[2:] if len(l.shape) > 2 else l.shape,
                                 l.itemsize, l.logical_axes) for l in leaves.values()]
    self.assertGreater(chunking.predicted_amplification(whole, chunking.fsdp_mesh(16))[0], 2.0)

  def test_restores_and_logits_are_unchanged(self):
    for items in (self.target, self.fine):
      report = validate_lib.validate(self.model_dir, items)
      self.assertTrue(report.v0_v1_identical)
      self.assertEqual(report.failures(THRESHOLDS), [], report)

  def test_reverse_direction_gives_the_checkpoint_back(self):
    original = checkpoint_io.read_safetensors_dir(self.model_dir)
    for items in (self.target, self.fine):
      back = os.path.join(harness.scratch_dir("back-"), "hf")
      to_huggingface.convert_to_huggingface(items, back, ReverseOptions())
      tensors = checkpoint_io.read_safetensors_dir(back)
      self.assertEqual(sorted(tensors), sorted(original))
      for name, value in original.items():
        self.assertEqual(tensors[name].tobytes(), value.tobytes(), name)

  def test_bad_target_mesh_is_refused(self):
    harness.assert_refused(self, self.model_dir, "--target_mesh", "pipeline", flags=("--target_mesh=pipeline=2",))


if __name__ == "__main__":
  absltest.main()
