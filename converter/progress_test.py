"""The progress bar: bytes, throughput and RSS on a terminal; nothing when disabled or not on a terminal."""

import io
import sys
from unittest import mock

from absl.testing import absltest

from converter.progress import Progress
from handlers import BlockWritten


class FakeTerminal(io.StringIO):

  def isatty(self):
    return True


def _run(stderr, enabled: bool) -> str:
  with mock.patch.object(sys, "stderr", stderr):
    progress = Progress(enabled=enabled)
    progress.start(4 << 20)
    for i in range(4):
      progress(BlockWritten("params.params.w", (i,), (i + 1,), 1 << 20))
    progress.close()
  return stderr.getvalue()


class ProgressTest(absltest.TestCase):

  def test_terminal_shows_bytes_and_rss(self):
    out = _run(FakeTerminal(), enabled=True)
    self.assertIn("saving", out)
    self.assertIn("4.00M/4.00M", out)
    self.assertIn("RSS", out)
    self.assertIn("100%", out)

  def test_quiet_when_disabled_or_not_a_terminal(self):
    self.assertEqual(_run(FakeTerminal(), enabled=False), "")
    self.assertEqual(_run(io.StringIO(), enabled=True), "")


if __name__ == "__main__":
  absltest.main()
