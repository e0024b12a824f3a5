"""The MaxText output's life: an existing step refused or replaced, a failed save leaving nothing loadable (eager:
nothing at all; lazy: parked for --resume), a resumed run finishing byte for byte as an uninterrupted one."""

import dataclasses
import os
import tempfile

from absl.testing import absltest

from converter import conversion
from converter.errors import ConversionError
from converter.options import PlanOptions, RunContext, SaveOptions
from converter.output import resume
from converter.output.maxtext import MaxTextOutput
from converter.output.record import conversion_record
from tools import checkpoint_io
from tools.testing.failing_loader import failing

MODEL = "testdata/tiny-qwen3"
SAVE = SaveOptions(devices=1, max_inflight_bytes=1 << 20)


class MaxTextOutputTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.plan = conversion.plan_conversion(MODEL, PlanOptions())
    cls.record = conversion_record(cls.plan, {})

  def _out(self) -> str:
    return os.path.join(tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir()), "out")

  def test_an_existing_checkpoint_is_refused_then_replaced_with_overwrite(self):
    out = self._out()
    written = MaxTextOutput(out, RunContext()).write(self.plan, SAVE, self.record)
    self.assertEqual(written.items_path, os.path.join(out, "0", "items"))
    self.assertEqual(written.written_bytes, self.plan.total_bytes)
    self.assertTrue(MaxTextOutput(out, RunContext()).has_checkpoint())
    with self.assertRaisesRegex(ConversionError, r"/0: a checkpoint already exists here; pass --overwrite"):
      MaxTextOutput(out, RunContext()).write(self.plan, SAVE, self.record)
    MaxTextOutput(out, RunContext(overwrite=True)).write(self.plan, SAVE, self.record)
    self.assertEqual(os.listdir(out), ["0"])  # No resume directory, no lock, no temporary step left.

  def test_a_failed_eager_save_leaves_nothing(self):
    out = self._out()
    with self.assertRaisesRegex(ConversionError, "nothing was committed$"):
      MaxTextOutput(out, RunContext()).write(failing(self.plan, -1), dataclasses.replace(SAVE, lazy=False),
                                             self.record)
    self.assertEqual(os.listdir(out), [])

  def test_a_failed_lazy_save_is_parked_and_a_resumed_one_matches_an_uninterrupted_one(self):
    out = self._out()
    with self.assertRaisesRegex(ConversionError, "what was written is kept: rerun with --resume"):
      MaxTextOutput(out, RunContext()).write(failing(self.plan, -1), SAVE, self.record)
    self.assertEqual(os.listdir(out), [resume.RESUME_DIR])
    parked = sorted(os.listdir(os.path.join(out, resume.RESUME_DIR)))
    self.assertIn("fingerprint.json", parked)
    self.assertIn("gen-0", parked)
    MaxTextOutput(out, RunContext(resume=True)).write(self.plan, SAVE, self.record)
    self.assertEqual(os.listdir(out), ["0"])  # The resume directory is dropped after the commit.
    reference = self._out()
    MaxTextOutput(reference, RunContext()).write(self.plan, SAVE, self.record)
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(os.path.join(out, "0", "items")),
                                                       checkpoint_io.restore_v0(os.path.join(reference, "0", "items"))),
                     [])

  def test_resuming_after_the_inputs_changed_is_refused(self):
    out = self._out()
    with self.assertRaises(ConversionError):
      MaxTextOutput(out, RunContext()).write(failing(self.plan, -1), SAVE, self.record)
    other = conversion.plan_conversion(MODEL, PlanOptions(save_dtype="float32"))
    with self.assertRaisesRegex(ConversionError, "cannot resume: the inputs or the plan changed"):
      MaxTextOutput(out, RunContext(resume=True)).write(other, SAVE, conversion_record(other, {}))


if __name__ == "__main__":
  absltest.main()
