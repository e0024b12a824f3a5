"""Leaves no handler saves are named by their tree path and type before a save starts; lazy tensors and arrays
are not."""

import numpy as np
from absl.testing import absltest

from handlers import LazyTensor, unhandled_leaves


class UnhandledLeavesTest(absltest.TestCase):

  def test_each_unsavable_leaf_is_named_by_path_and_type(self):
    tree = {"params": {"w": LazyTensor("w", (2, 2), np.float32, lambda: np.zeros((2, 2), np.float32)),
                       "b": np.zeros(3, np.float32), "odd": object()}}
    self.assertEqual(unhandled_leaves(tree), ["['params']['odd']: builtins.object"])
    self.assertEqual(unhandled_leaves({"w": tree["params"]["w"]}), [])


if __name__ == "__main__":
  absltest.main()
