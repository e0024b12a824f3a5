"""ReusedProcess: answers come back in order from one child; a child that dies or stalls yields None and is
stopped, so the caller can fall back to a fresh process."""

import sys
import textwrap

from absl.testing import absltest

from tools.testing.reused_process import ReusedProcess

# Answers {"echo": ..., "pid": ...} per request; exits on "die"; never answers "stall".
_CHILD = textwrap.dedent("""
    import json, os, sys, time
    answers = os.fdopen(int(sys.argv[1]), "w")
    for line in sys.stdin:
      request = json.loads(line)
      if request["do"] == "die":
        sys.exit(3)
      if request["do"] == "stall":
        time.sleep(60)
      answers.write(json.dumps({"echo": request["do"], "pid": os.getpid()}) + "\\n")
      answers.flush()
    """)


def _child() -> ReusedProcess:
  return ReusedProcess(lambda fd: [sys.executable, "-c", _CHILD, str(fd)], env={})


class ReusedProcessTest(absltest.TestCase):

  def test_one_process_answers_every_request_in_order(self):
    child = _child()
    answers = [child.request({"do": f"case {i}"}, timeout=30) for i in range(3)]
    self.assertEqual([a["echo"] for a in answers], ["case 0", "case 1", "case 2"])
    self.assertEqual(len({a["pid"] for a in answers}), 1)
    self.assertTrue(child.alive)
    child.close()
    self.assertFalse(child.alive)

  def test_a_child_that_dies_answers_none(self):
    child = _child()
    self.assertIsNone(child.request({"do": "die"}, timeout=30))
    self.assertFalse(child.alive)

  def test_a_child_that_stalls_is_stopped(self):
    child = _child()
    self.assertIsNone(child.request({"do": "stall"}, timeout=0.5))
    self.assertFalse(child.alive)


if __name__ == "__main__":
  absltest.main()
