"""The primary process's steps: its action runs there alone, each process returns only past the step's barrier."""

from unittest import mock

from absl.testing import absltest

from converter import processes as processes_lib
from converter.output import primary
from handlers.shares import Processes


class PrimaryTest(absltest.TestCase):

  def test_only_the_primary_acts_and_every_process_passes_the_barrier(self):
    for index in (0, 1):
      calls = []
      with mock.patch.object(processes_lib, "barrier", lambda step, processes: calls.append(("barrier", step))):
        result = primary.on_primary_then_all(Processes(index, 2), "prepared", lambda: calls.append("act") or 7)
        primary.all_then_on_primary(Processes(index, 2), "written", lambda: calls.append("publish"))
      if index == 0:
        self.assertEqual(result, 7)
        self.assertEqual(calls, ["act", ("barrier", "prepared"), ("barrier", "written"), "publish"])
      else:
        self.assertIsNone(result)
        self.assertEqual(calls, [("barrier", "prepared"), ("barrier", "written")])


if __name__ == "__main__":
  absltest.main()
