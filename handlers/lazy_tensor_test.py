"""LazyTensor: metadata without loading, casts, shape checks, named errors, copies and pickles."""

import copy
import functools
import pickle

import ml_dtypes
import numpy as np
from absl.testing import absltest

from handlers import LazyTensor, LazyTensorLoadError


class CountingLoader:
  """Picklable loader that records how often it ran."""

  def __init__(self, value):
    self.value = value
    self.calls = 0

  def __call__(self):
    self.calls += 1
    return self.value


def _failing_loader():
  raise OSError("disk went away")


def _arange(n):
  return np.arange(n, dtype=np.float32)


class LazyTensorTest(absltest.TestCase):

  def test_metadata_without_loading(self):
    loader = CountingLoader(np.zeros((3, 5), np.float32))
    lazy = LazyTensor("w", (3, 5), ml_dtypes.bfloat16, loader)
    self.assertEqual((lazy.shape, lazy.ndim, lazy.size), ((3, 5), 2, 15))
    self.assertEqual((lazy.itemsize, lazy.nbytes), (2, 30))
    self.assertEqual(lazy.dtype, np.dtype(ml_dtypes.bfloat16))
    self.assertEqual(loader.calls, 0)

  def test_array_is_cast_to_declared_dtype(self):
    values = np.array([1.0, 1.00390625, -3.5], np.float32)
    lazy = LazyTensor("w", (3,), ml_dtypes.bfloat16, CountingLoader(values))
    out = np.asarray(lazy)
    self.assertEqual(out.dtype, np.dtype(ml_dtypes.bfloat16))
    np.testing.assert_array_equal(out, values.astype(ml_dtypes.bfloat16))

  def test_array_honours_requested_dtype(self):
    lazy = LazyTensor("w", (4,), np.float32, functools.partial(_arange, 4))
    out = lazy.__array__(np.float64)
    self.assertEqual(out.dtype, np.float64)
    np.testing.assert_array_equal(out, np.arange(4))

  def test_wrong_loaded_shape_is_named(self):
    lazy = LazyTensor("decoder/w", (2, 3), np.float32, CountingLoader(np.zeros((3, 2), np.float32)))
    with self.assertRaisesRegex(LazyTensorLoadError, r"decoder/w.*\(3, 2\).*\(2, 3\)"):
      np.asarray(lazy)

  def test_loader_failure_is_reraised_with_name(self):
    lazy = LazyTensor("decoder/layers/wo", (1,), np.float32, _failing_loader)
    with self.assertRaisesRegex(LazyTensorLoadError, r"decoder/layers/wo.*OSError.*disk went away") as ctx:
      np.asarray(lazy)
    self.assertIsInstance(ctx.exception.__cause__, OSError)

  def test_deepcopy_and_pickle_keep_values(self):
    lazy = LazyTensor("w", (5,), ml_dtypes.bfloat16, functools.partial(_arange, 5))
    for clone in (copy.deepcopy(lazy), pickle.loads(pickle.dumps(lazy))):
      self.assertIsInstance(clone, LazyTensor)
      self.assertEqual((clone.name, clone.shape, clone.dtype), (lazy.name, lazy.shape, lazy.dtype))
      np.testing.assert_array_equal(np.asarray(clone), np.asarray(lazy))


if __name__ == "__main__":
  absltest.main()
