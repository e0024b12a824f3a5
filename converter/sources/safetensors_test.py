"""The plain source: every region read equals the same region of the stored tensor, in the dtype asked for."""

import os
import tempfile

import ml_dtypes
import numpy as np
from absl.testing import absltest

from converter.errors import ConversionError
from converter.sources import open_safetensors
from tools.safetensors_writer import write_safetensors


class SafetensorsSourceTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    rng = np.random.default_rng(0)
    self.stacked = rng.standard_normal((5, 6, 7)).astype(ml_dtypes.bfloat16)
    self.scales = np.exp2(rng.integers(-3, 3, (4, 3))).astype(ml_dtypes.float8_e8m0fnu)
    write_safetensors(os.path.join(self.dir, "model.safetensors"), {"stacked": self.stacked, "scales": self.scales})
    self.source = open_safetensors(self.dir)

  def test_regions_of_leading_axes(self):
    tensor = self.source.tensors["stacked"]
    self.assertEqual((tensor.shape, tensor.format), ((5, 6, 7), "BF16"))
    for region in [(), (slice(1, 3),), (2,), (4, slice(2, 6)), (slice(0, 5), slice(5, 6))]:
      value = tensor.read(None, region)
      np.testing.assert_array_equal(value, self.stacked[region])
      self.assertTrue(value.flags.c_contiguous and value.flags.writeable)

  def test_cast_is_exact_and_bfloat16_stays_bfloat16(self):
    tensor = self.source.tensors["stacked"]
    self.assertEqual(tensor.read().dtype, ml_dtypes.bfloat16)
    np.testing.assert_array_equal(tensor.read(np.float32, (3,)), self.stacked[3].astype(np.float32))

  def test_power_of_two_scales_are_readable(self):
    np.testing.assert_array_equal(self.source.tensors["scales"].read(np.float32), self.scales.astype(np.float32))

  def test_strided_regions_are_refused_with_the_tensor_name(self):
    with self.assertRaisesRegex(ConversionError, "'stacked'.*step-1"):
      self.source.tensors["stacked"].read(None, (slice(0, 5, 2),))


if __name__ == "__main__":
  absltest.main()
