"""The conversion record: what a conversion writes is what every reader reads back, and checkpoints that record
nothing (MaxText's own) read as empty fields."""

import json
import os
import tempfile

from absl.testing import absltest

from converter import conversion
from converter.errors import ConversionError
from converter.options import PlanOptions
from converter.output.record import KEY, ConversionRecord


def _items_with_metadata(metadata) -> str:
  step = os.path.join(tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir()), "0")
  os.makedirs(os.path.join(step, "items"))
  with open(os.path.join(step, "_CHECKPOINT_METADATA"), "w") as f:
    f.write(metadata if isinstance(metadata, str) else json.dumps(metadata))
  return os.path.join(step, "items")


class ConversionRecordTest(absltest.TestCase):

  def test_what_is_written_reads_back(self):
    plan = conversion.plan_conversion("testdata/tiny-qwen3", PlanOptions(scan_layers=False, save_dtype="float32"))
    record = ConversionRecord.of_plan(plan, {"vocab_size": 257})
    metadata = record.custom_metadata()
    self.assertEqual(set(metadata), {"scan_layers", KEY})
    self.assertIs(metadata["scan_layers"], False)
    self.assertEqual(metadata[KEY]["family"], "qwen3")
    self.assertEqual(metadata[KEY]["save_dtype"], "float32")
    with open("testdata/tiny-qwen3/config.json") as f:
      self.assertEqual(metadata[KEY]["hf_config"], json.load(f))
    read = ConversionRecord.read(_items_with_metadata({"custom_metadata": metadata}))
    self.assertEqual(read, record)

  def test_a_checkpoint_maxtext_wrote_records_only_scan_layers(self):
    read = ConversionRecord.read(_items_with_metadata({"custom_metadata": {"scan_layers": True}}))
    self.assertEqual(read, ConversionRecord(scan_layers=True))
    self.assertIsNone(read.hf_config)

  def test_missing_metadata_is_an_empty_record(self):
    self.assertEqual(ConversionRecord.read(os.path.join(self.create_tempdir().full_path, "0", "items")), ConversionRecord())

  def test_unknown_fields_from_a_newer_converter_are_ignored(self):
    read = ConversionRecord.read(_items_with_metadata({"custom_metadata": {KEY: {"family": "qwen3", "new": 1}}}))
    self.assertEqual(read.family, "qwen3")

  def test_unreadable_metadata_names_the_file(self):
    items = _items_with_metadata("{not json")
    with self.assertRaisesRegex(ConversionError, "_CHECKPOINT_METADATA: unreadable checkpoint metadata"):
      ConversionRecord.read(items)


if __name__ == "__main__":
  absltest.main()
