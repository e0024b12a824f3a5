"""run_sampled measures the peak of the whole process tree, not of the process that started it."""

import sys

from absl.testing import absltest

from tools.process_sampling import run_sampled

# A child holding 200 MiB for half a second, started by another child that holds little.
_GRANDCHILD = "import time; b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(0.5)"
_CHILD = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {_GRANDCHILD!r}], check=True)"


class RunSampledTest(absltest.TestCase):

  def test_the_peak_of_a_tree_and_not_of_its_parent(self):
    ballast = bytearray(300 << 20)  # This process larger than the tree: wait4's ru_maxrss would report it.
    ballast[::4096] = b"x" * len(ballast[::4096])
    wall, peak, result = run_sampled([sys.executable, "-c", _CHILD], {})
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertGreater(peak, 200 << 20)
    self.assertLess(peak, 290 << 20)
    self.assertGreater(wall, 0.5)
    del ballast


if __name__ == "__main__":
  absltest.main()
