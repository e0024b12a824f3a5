"""The blocked transpose equals numpy's, for 2-D and stacked (3-D) arrays, and is contiguous."""

import numpy as np
from absl.testing import absltest

from converter import arrays


class ArraysTest(absltest.TestCase):

  def test_transpose_last_two_equals_numpy(self):
    for shape in ((1, 1), (5, 3), (16, 7), (33, 70), (100, 17), (3, 33, 20)):
      x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
      y = arrays.transpose_last_two(x)
      np.testing.assert_array_equal(y, np.swapaxes(x, -1, -2))
      self.assertTrue(y.flags.c_contiguous)


if __name__ == "__main__":
  absltest.main()
