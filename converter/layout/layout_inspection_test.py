"""An existing checkpoint's stored layout, read back from its metadata: what the conversion stored and recorded,
and for a checkpoint without a record (MaxText's own), the logical axes its paths imply."""

import json
import os
import tempfile

from absl.testing import absltest

from converter import conversion
from converter.layout import chunking, layout_inspection
from converter.options import PlanOptions, SaveOptions
from converter.checkpoint_format import layout

MODEL = "testdata/tiny-qwen3"
MESH = chunking.parse_mesh("fsdp=4,tensor=2")


class LayoutInspectionTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    out = os.path.join(tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir()), "out")
    rule = chunking.ChunkRule(target_mesh=MESH)
    cls.items = conversion.convert_to_maxtext(MODEL, out, PlanOptions(chunking=rule), SaveOptions(devices=1)).items_path
    cls.rule = rule

  def test_stored_chunks_and_recorded_axes(self):
    leaves, record = layout_inspection.stored_leaves(self.items)
    self.assertEqual(record, self.rule.record())
    wo = leaves["decoder/layers/mlp/wo/kernel"]
    self.assertEqual(tuple(wo.logical_axes), ("mlp", "layers", "embed"))
    self.assertEqual(wo.chunk, self.rule.chunk_shape(wo.shape, wo.logical_axes, wo.itemsize))
    self.assertEqual(chunking.predicted_amplification(list(leaves.values()), MESH)[1],
                     chunking.ideal_amplification(list(leaves.values()), MESH))

  def test_a_checkpoint_without_a_record_gets_the_axes_its_paths_imply(self):
    recorded, _ = layout_inspection.stored_leaves(self.items)
    path = layout.metadata_path(self.items)
    with open(path) as f:
      original = f.read()
    metadata = json.loads(original)
    metadata["custom_metadata"] = {"scan_layers": True}  # As MaxText's own trainer writes it.
    try:
      with open(path, "w") as f:
        json.dump(metadata, f)
      derived, record = layout_inspection.stored_leaves(self.items)
    finally:
      with open(path, "w") as f:
        f.write(original)
    self.assertIsNone(record)
    self.assertEqual({n: tuple(l.logical_axes) for n, l in derived.items()},
                     {n: tuple(l.logical_axes) for n, l in recorded.items()})

  def test_every_stored_chunk_is_checksummed_unless_turned_off(self):
    self.assertEqual(layout_inspection.unchecksummed_leaves(self.items), [])
    out = os.path.join(tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir()), "out")
    plain = conversion.convert_to_maxtext(MODEL, out, PlanOptions(chunking=self.rule),
                                          SaveOptions(devices=1, checksums=False)).items_path
    leaves, _ = layout_inspection.stored_leaves(plain)
    self.assertEqual(layout_inspection.unchecksummed_leaves(plain), sorted(leaves))


if __name__ == "__main__":
  absltest.main()
