"""The launcher (tools/python3) asks glibc for huge pages under malloc, and a user's own setting wins.

glibc ignores a tunable it cannot parse or whose value is out of range without a word, so the values are read
back from the dynamic loader itself (`ld.so --list-tunables`, in a child of the launched Python).
"""

import os
import re
import subprocess

from absl.testing import absltest

import converter

LAUNCHER = os.path.join(os.path.dirname(os.path.dirname(converter.__file__)), "tools", "python3")
LIST_TUNABLES = ("import glob, subprocess, sys;"
                 " loader = sorted(glob.glob('/lib*/ld-linux*.so*') + glob.glob('/lib/*/ld-linux*.so*'))[0];"
                 " sys.stdout.write(subprocess.run([loader, '--list-tunables'], capture_output=True, text=True).stdout)")


def malloc_tunables(**env: str) -> dict[str, int]:
  """The glibc.malloc tunables a Python started through the launcher (with `env` added) runs with."""
  result = subprocess.run([LAUNCHER, "-c", LIST_TUNABLES], env={**os.environ, **env}, capture_output=True,
                          text=True, check=True)
  return {m.group(1): int(m.group(2), 16) for m in re.finditer(r"^glibc\.malloc\.(\w+): 0x([0-9a-f]+)",
                                                               result.stdout, re.M)}


class LauncherTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    if not malloc_tunables():
      self.skipTest("this glibc's loader cannot list its tunables (needs glibc 2.33 or later)")

  def test_huge_pages_by_default(self):
    self.assertEqual(malloc_tunables(GLIBC_TUNABLES="")["hugetlb"], 1)

  def test_a_users_own_setting_wins_and_others_are_kept(self):
    tunables = malloc_tunables(GLIBC_TUNABLES="glibc.malloc.hugetlb=0:glibc.malloc.arena_max=8")
    self.assertEqual(tunables["hugetlb"], 0)
    self.assertEqual(tunables["arena_max"], 8)
    tunables = malloc_tunables(GLIBC_TUNABLES="glibc.malloc.arena_max=8")
    self.assertEqual((tunables["hugetlb"], tunables["arena_max"]), (1, 8))


if __name__ == "__main__":
  absltest.main()
