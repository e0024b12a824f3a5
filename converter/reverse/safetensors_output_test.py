"""The streaming safetensors writer syncs its file as it closes, reports a failed sync naming the file, and a
failed write's abort does not hide the error that made it fail; --max_shard_size values parse as documented."""

import errno
import os
import tempfile
from unittest import mock

import numpy as np
from absl.testing import absltest

from converter.reverse import safetensors_output
from converter.errors import ConversionError
from converter.reverse.safetensors_output import SafetensorsStreamWriter, TensorSpec

_SPECS = [TensorSpec("w", (2, 3), np.dtype(np.float32))]
_EIO = OSError(errno.EIO, "Input/output error")


class SafetensorsStreamWriterTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.path = os.path.join(tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir()), "model.safetensors")

  def test_a_failed_sync_on_close_names_the_file(self):
    writer = SafetensorsStreamWriter(self.path, _SPECS)
    writer.write("w", np.ones((2, 3), np.float32))
    with mock.patch.object(os, "fsync", side_effect=_EIO):
      with self.assertRaisesRegex(ConversionError, f"{self.path}: closing failed: .*Input/output error"):
        writer.close()

  def test_abort_does_not_raise_over_the_original_error(self):
    writer = SafetensorsStreamWriter(self.path, _SPECS)
    with mock.patch.object(os, "fsync", side_effect=_EIO):
      writer.abort()


class ParseSizeTest(absltest.TestCase):

  def test_max_shard_size_parsing(self):
    # Decimal and binary units, any case, a space and a fraction; a plain int passes through; the rest is refused.
    self.assertEqual(safetensors_output.parse_size("5GB"), 5 * 10**9)
    self.assertEqual(safetensors_output.parse_size("500MB"), 500 * 10**6)
    self.assertEqual(safetensors_output.parse_size("2GiB"), 2 * 2**30)
    self.assertEqual(safetensors_output.parse_size("1.5 kb"), 1500)
    self.assertEqual(safetensors_output.parse_size(12345), 12345)
    for bad in ("", "5XB", "-1GB", "0"):
      with self.assertRaises(ConversionError):
        safetensors_output.parse_size(bad)


if __name__ == "__main__":
  absltest.main()
