"""The record a conversion writes: what the plan says of the output and what its source states of itself, read
back unchanged."""

import json
import os
import tempfile

from absl.testing import absltest

from converter import conversion
from converter.checkpoint_format.record import KEY, ConversionRecord
from converter.options import PlanOptions
from converter.output.record import conversion_record


class ConversionRecordTest(absltest.TestCase):

  def test_a_conversion_records_its_plan_and_reads_back(self):
    plan = conversion.plan_conversion("testdata/tiny-qwen3", PlanOptions(scan_layers=False, save_dtype="float32"))
    record = conversion_record(plan, {"vocab_size": 257})
    metadata = record.custom_metadata()
    self.assertIs(metadata["scan_layers"], False)
    self.assertEqual((metadata[KEY]["family"], metadata[KEY]["save_dtype"]), ("qwen3", "float32"))
    self.assertEqual(metadata[KEY]["maxtext_overrides"], {"vocab_size": 257})
    self.assertEqual(metadata[KEY]["hf_source"], {"location": "testdata/tiny-qwen3", "revision": None})
    with open("testdata/tiny-qwen3/config.json") as f:
      self.assertEqual(metadata[KEY]["hf_config"], json.load(f))
    self.assertEqual(set(metadata[KEY]["logical_axes"]), {leaf.name for leaf in plan.leaves})
    step = os.path.join(tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir()), "0")
    os.makedirs(os.path.join(step, "items"))
    with open(os.path.join(step, "_CHECKPOINT_METADATA"), "w") as f:
      json.dump({"custom_metadata": metadata}, f)
    self.assertEqual(ConversionRecord.read(os.path.join(step, "items")), record)


if __name__ == "__main__":
  absltest.main()
