"""After malloc.configure(), a block as large as the write blocks comes from the heap and, once freed, stays there
for the next one; a re-layout's configuration and glibc's default map and unmap it. Each case runs in a fresh process:
malloc's settings are the process's own."""

import os
import subprocess
import sys

from absl.testing import absltest

import converter

REPO = os.path.dirname(os.path.dirname(converter.__file__))

# Prints, for a 24 MiB block: bytes of mapped chunks it added, and the heap's releasable top once it was freed.
_PROBE = """
import ctypes, sys
import numpy as np
from converter import malloc

class MallInfo2(ctypes.Structure):
  _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                            "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "configure" and not malloc.configure():
  sys.exit("mallopt refused a setting")
if sys.argv[1] == "relayout" and not malloc.configure(malloc.RELAYOUT_MMAP_THRESHOLD_BYTES):
  sys.exit("mallopt refused a setting")
mapped = libc.mallinfo2().hblkhd
block = np.ones(24 << 20, np.uint8)
mapped = libc.mallinfo2().hblkhd - mapped
del block
print(mapped, libc.mallinfo2().keepcost)
"""


def probe(mode: str) -> tuple[int, int]:
  result = subprocess.run([sys.executable, "-c", _PROBE, mode], env={**os.environ, "PYTHONPATH": REPO},
                          capture_output=True, text=True, check=True)
  mapped, kept = result.stdout.split()
  return int(mapped), int(kept)


class MallocTest(absltest.TestCase):

  def test_blocks_come_from_the_heap_and_stay_for_the_next(self):
    mapped, kept = probe("configure")
    self.assertEqual(mapped, 0)
    self.assertGreaterEqual(kept, 24 << 20)

  def test_a_relayout_maps_its_blocks_and_gives_them_back(self):
    # Its read pieces alone stay in the heap (see malloc.RELAYOUT_MMAP_THRESHOLD_BYTES).
    mapped, kept = probe("relayout")
    self.assertGreaterEqual(mapped, 24 << 20)
    self.assertLess(kept, 24 << 20)

  def test_without_it_glibc_maps_and_unmaps_each_block(self):
    mapped, kept = probe("default")
    self.assertGreaterEqual(mapped, 24 << 20)
    self.assertLess(kept, 24 << 20)


if __name__ == "__main__":
  absltest.main()
