"""Counts test cases (not Bazel targets) from the JUnit XML each test wrote, for CI's closing line.

Usage: count_tests.py BAZEL_LOG TESTLOGS_DIR. A target that ran but left no XML (it crashed before its test
runner started) counts as one failure; so does any target the log reports as failed, timed out or unbuilt.
"""

import glob
import os
import re
import sys
import xml.etree.ElementTree as ET

STATUS = re.compile(r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FLAKY|FAILED|TIMEOUT|NO STATUS|INCOMPLETE|REMOTE FAILURE)")


def target_xmls(testlogs: str, target: str) -> list[str]:
  """The target's test.xml, or one per shard (shard_K_of_N/test.xml) for a sharded test."""
  package, name = target[2:].split(":")
  directory = os.path.join(testlogs, package, name)
  shards = sorted(glob.glob(os.path.join(directory, "shard_*_of_*", "test.xml")))
  return shards or [os.path.join(directory, "test.xml")]


def count(log_path: str, testlogs: str) -> tuple[int, int]:
  passed = failed = 0
  with open(log_path, errors="replace") as f:
    statuses = [m.groups() for m in map(STATUS.match, f) if m]
  for target, status in statuses:
    cases = []
    for xml_path in target_xmls(testlogs, target):
      if os.path.exists(xml_path):
        try:
          cases += list(ET.parse(xml_path).getroot().iter("testcase"))
        except ET.ParseError:
          pass
    if not cases:
      passed, failed = (passed + 1, failed) if status == "PASSED" else (passed, failed + 1)
      continue
    target_failed = 0
    for case in cases:
      if case.find("failure") is not None or case.find("error") is not None:
        target_failed += 1
      elif case.get("status") != "notrun" and case.find("skipped") is None:
        passed += 1
    if status != "PASSED" and target_failed == 0:
      target_failed = 1  # The runner passed its cases but the target failed (timeout, crash at exit).
    failed += target_failed
  return passed, failed


if __name__ == "__main__":
  p, f = count(sys.argv[1], sys.argv[2])
  print(f"{p} passed, {f} failed")
