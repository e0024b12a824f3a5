"""The conversion record: what a conversion writes is what every reader reads back, and checkpoints that record
nothing (MaxText's own) read as empty fields."""

import json
import os
import tempfile

from absl.testing import absltest

from converter.checkpoint_format.original import Original
from converter.checkpoint_format.record import KEY, ConversionRecord, original_config, original_model
from converter.errors import ConversionError


def _items_with_metadata(metadata) -> str:
  step = os.path.join(tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir()), "0")
  os.makedirs(os.path.join(step, "items"))
  with open(os.path.join(step, "_CHECKPOINT_METADATA"), "w") as f:
    f.write(metadata if isinstance(metadata, str) else json.dumps(metadata))
  return os.path.join(step, "items")


class ConversionRecordTest(absltest.TestCase):

  def test_what_is_written_reads_back(self):
    record = ConversionRecord(scan_layers=False, family="qwen3", save_dtype="float32", hf_config={"vocab_size": 5},
                              hf_source=Original("Qwen/Qwen3-8B", "main").record(), lora_adapter={"r": 4})
    metadata = record.custom_metadata()
    self.assertEqual(set(metadata), {"scan_layers", KEY})
    self.assertIs(metadata["scan_layers"], False)
    self.assertEqual((metadata[KEY]["family"], metadata[KEY]["lora_adapter"]), ("qwen3", {"r": 4}))
    read = ConversionRecord.read(_items_with_metadata({"custom_metadata": metadata}))
    self.assertEqual(read, record)
    self.assertEqual(original_model(read, None), Original("Qwen/Qwen3-8B", "main"))
    self.assertEqual(original_config("/out/0/items", read, None)[0], {"vocab_size": 5})

  def test_a_config_path_overrides_the_recorded_original(self):
    directory = self.create_tempdir().full_path
    with open(os.path.join(directory, "config.json"), "w") as f:
      json.dump({"vocab_size": 7}, f)
    record = ConversionRecord(hf_config={"vocab_size": 5}, hf_source=Original("Qwen/Qwen3-8B", "main").record())
    for given in (directory, os.path.join(directory, "config.json")):
      self.assertEqual(original_config("/out/0/items", record, given), ({"vocab_size": 7},
                                                                         os.path.join(directory, "config.json")))
      self.assertEqual(original_model(record, given), Original(directory))
    with self.assertRaisesRegex(ConversionError, "records no hf2maxtext.hf_config.*--hf_config_path"):
      original_config("/out/0/items", ConversionRecord(scan_layers=True), None)

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

  def test_fields_of_the_wrong_type_are_refused_by_name(self):
    for custom, field in [({KEY: {"family": ["qwen3"]}}, f"{KEY}.family is an array"),
                          ({KEY: {"fp8": "yes"}}, f"{KEY}.fp8 is a string"),
                          ({"scan_layers": "false"}, "scan_layers is a string")]:
      with self.subTest(field=field):
        items = _items_with_metadata({"custom_metadata": custom})
        with self.assertRaisesRegex(ConversionError, f"_CHECKPOINT_METADATA: custom_metadata.{field}"):
          ConversionRecord.read(items)

  def test_metadata_that_is_not_utf8_or_nested_without_bound_names_the_file(self):
    for text in ('{"custom_metadata": "\udcff"}'.encode("utf-8", "surrogatepass"), b"[" * 100_000):
      step = os.path.dirname(_items_with_metadata({}))
      with open(os.path.join(step, "_CHECKPOINT_METADATA"), "wb") as f:
        f.write(text)
      with self.assertRaisesRegex(ConversionError, "_CHECKPOINT_METADATA: unreadable checkpoint metadata"):
        ConversionRecord.read(os.path.join(step, "items"))


if __name__ == "__main__":
  absltest.main()
