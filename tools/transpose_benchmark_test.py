"""The transpose benchmark times every kernel and refuses to time one that transposes wrongly."""

from unittest import mock

import ml_dtypes
import numpy as np
from absl.testing import absltest

from tools import transpose_benchmark


class TransposeBenchmarkTest(absltest.TestCase):

  def test_times_every_kernel(self):
    x = np.arange(6 * 10, dtype=np.uint16).reshape(6, 10).view(ml_dtypes.bfloat16)
    speeds = transpose_benchmark.speeds(x, rounds=2, nbytes=x.nbytes * 3)
    self.assertEqual(set(speeds), {name for name, _ in transpose_benchmark.KERNELS})
    self.assertTrue(all(speed > 0 for speed in speeds.values()))

  def test_a_wrong_transpose_is_refused(self):
    x = np.arange(4 * 5, dtype=np.float32).reshape(4, 5)
    wrong = (("converter (tiles)", lambda v: np.ascontiguousarray(v.T[::-1])),) + transpose_benchmark.KERNELS[1:]
    with mock.patch.object(transpose_benchmark, "KERNELS", wrong):
      with self.assertRaisesRegex(AssertionError, "converter \\(tiles\\) transposed"):
        transpose_benchmark.speeds(x, rounds=1, nbytes=x.nbytes)


if __name__ == "__main__":
  absltest.main()
