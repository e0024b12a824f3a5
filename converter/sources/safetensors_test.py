"""The plain source: every region read equals the same region of the stored tensor, in the dtype asked for."""

import json
import os
import re
import struct
import tempfile

import ml_dtypes
import numpy as np
from absl.testing import absltest

from converter import storage
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

  def test_transposed_regions_swap_the_last_two_axes(self):
    tensor = self.source.tensors["stacked"]
    # (slice, int): the int indexes one of the two axes, so they are swapped after the copy, not during it.
    for region in [(), (slice(1, 3),), (2,), (4, slice(2, 6)), (slice(0, 5), 5)]:
      for dtype in (None, np.float32):
        value = tensor.read(dtype, region, transpose=True)
        expected = self.stacked[region].astype(dtype or ml_dtypes.bfloat16)
        np.testing.assert_array_equal(value, np.swapaxes(expected, -1, -2))
        self.assertEqual(value.dtype, expected.dtype)
        self.assertTrue(value.flags.c_contiguous)

  def test_cast_is_exact_and_bfloat16_stays_bfloat16(self):
    tensor = self.source.tensors["stacked"]
    self.assertEqual(tensor.read().dtype, ml_dtypes.bfloat16)
    np.testing.assert_array_equal(tensor.read(np.float32, (3,)), self.stacked[3].astype(np.float32))

  def test_power_of_two_scales_are_readable(self):
    np.testing.assert_array_equal(self.source.tensors["scales"].read(np.float32), self.scales.astype(np.float32))

  def test_strided_regions_are_refused_with_the_tensor_name(self):
    with self.assertRaisesRegex(ConversionError, "'stacked'.*step-1"):
      self.source.tensors["stacked"].read(None, (slice(0, 5, 2),))


class MalformedInputTest(absltest.TestCase):
  """A header or index that is valid JSON of the wrong shape is refused naming the file, and the tensor or field."""

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    self.file = os.path.join(self.dir, "model.safetensors")

  def _with_header(self, header) -> None:
    raw = json.dumps(header).encode()
    with open(self.file, "wb") as f:
      f.write(struct.pack("<Q", len(raw)) + raw + bytes(64))

  def test_header_entries_of_the_wrong_type_or_range(self):
    good = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    cases = [
        ({"x": [1, 2]}, "entry for tensor 'x'"),
        ({"x": dict(good, dtype=["F32"])}, "tensor 'x' has unknown dtype"),
        ({"x": dict(good, shape=[2.0, 2])}, "tensor 'x': shape"),
        ({"x": dict(good, shape=[True, 16])}, "tensor 'x': shape"),
        ({"x": dict(good, shape=[-2, -2])}, "tensor 'x': shape"),
        ({"x": dict(good, shape=[1] * 65)}, "tensor 'x': shape"),
        ({"x": dict(good, shape=[2**62, 2**62], data_offsets=[0, 0])}, "more elements than any file holds"),
        ({"x": dict(good, data_offsets=[0, 16, 32])}, "tensor 'x': data_offsets"),
        ({"x": dict(good, data_offsets=[16, 0])}, "tensor 'x': data_offsets"),
        ({"x": dict(good, data_offsets=[0, 16.0])}, "tensor 'x': data_offsets"),
        ({"x": dict(good, shape=[2, 3])}, "tensor 'x': header byte range 0..16 does not fit"),
        ({"__metadata__": {"format": 1}, "x": good}, "__metadata__ must map names to strings"),
        ({"__metadata__": [], "x": good}, "__metadata__ must map names to strings"),
    ]
    for header, reason in cases:
      with self.subTest(reason=reason, header=str(header)[:60]):
        self._with_header(header)
        with self.assertRaisesRegex(ConversionError, f"^{self.file}: .*{re.escape(reason)}"):
          open_safetensors(self.dir)

  def test_header_nested_without_bound(self):
    raw = b"[" * 100_000 + b"]" * 100_000
    with open(self.file, "wb") as f:
      f.write(struct.pack("<Q", len(raw)) + raw)
    with self.assertRaisesRegex(ConversionError, f"^{self.file}: corrupt safetensors header \\(not valid JSON"):
      open_safetensors(self.dir)

  def test_index_weight_map_of_the_wrong_shape(self):
    write_safetensors(os.path.join(self.dir, "a.safetensors"), {"x": np.zeros((2,), np.float32)})
    index_path = os.path.join(self.dir, "model.safetensors.index.json")
    cases = [
        ({"weight_map": None}, "a weight_map that is null"),
        ({"weight_map": []}, "a weight_map that is an array"),
        ({"weight_map": 3}, "a weight_map that is a number"),
        ({"metadata": {}}, "no weight_map"),
        ([], "no weight_map"),
        ({"weight_map": {}}, "the index lists no tensors"),
        ({"weight_map": {"x": 5}}, "puts tensor 'x' in 5, which is not the name of a file"),
        ({"weight_map": {"x": "/etc/passwd"}}, "puts tensor 'x' in '/etc/passwd'"),
        ({"weight_map": {"x": "../a.safetensors"}}, "puts tensor 'x' in '../a.safetensors'"),
        ({"weight_map": {"x": ""}}, "puts tensor 'x' in ''"),
        ({"weight_map": {"x": "."}}, "puts tensor 'x' in '.'"),
    ]
    for index, reason in cases:
      with self.subTest(reason=reason):
        with open(index_path, "w") as f:
          json.dump(index, f)
        with self.assertRaisesRegex(ConversionError, f"^{index_path}: .*{re.escape(reason)}"):
          open_safetensors(self.dir)
    with open(index_path, "wb") as f:
      f.write(b'{"w\xe9ight_map": {}}')
    with self.assertRaisesRegex(ConversionError, f"^{index_path}: unreadable safetensors index \\(not valid JSON:"
                                " UnicodeDecodeError"):
      open_safetensors(self.dir)
    with open(index_path, "w") as f:
      json.dump({"weight_map": {"x": "a.safetensors"}}, f)
    self.assertEqual(list(open_safetensors(self.dir).tensors), ["x"])


class RemoteReadsTest(absltest.TestCase):
  """A bucket checkpoint is read as headers first, then exactly the byte range of each region: every storage call
  is recorded (the same files served as gs:// paths; gcs_test runs the real endpoint)."""

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    rng = np.random.default_rng(1)
    self.big = rng.standard_normal((64, 32, 16)).astype(ml_dtypes.bfloat16)  # 64 KiB
    self.grid = rng.standard_normal((40, 24)).astype(np.float32)
    write_safetensors(os.path.join(self.dir, "model.safetensors"), {"big": self.big, "grid": self.grid})
    self.reads: list[tuple[str, int, int | None]] = []
    local = lambda path: path.replace("gs://bucket/model", self.dir)
    real_read_bytes, real_size, real_is_file = storage.read_bytes, storage.size, storage.is_file

    def read_bytes(path, start=0, stop=None):
      self.reads.append((os.path.basename(path), start, stop))
      return real_read_bytes(local(path), start, stop)

    for name, replacement in [("read_bytes", read_bytes), ("size", lambda p: real_size(local(p))),
                              ("is_file", lambda p: real_is_file(local(p)))]:
      patcher = absltest.mock.patch.object(storage, name, replacement)
      patcher.start()
      self.addCleanup(patcher.stop)
    self.source = open_safetensors("gs://bucket/model")

  def test_only_the_header_is_read_on_opening(self):
    self.assertEqual([r[1:] for r in self.reads][:1], [(0, 8)])
    self.assertLen(self.reads, 2)
    header_end = self.reads[1][2]
    self.assertLess(header_end, 1024)

  def test_each_region_reads_exactly_its_bytes(self):
    big = self.source.tensors["big"]
    for region in [(5,), (slice(10, 13),), (63, slice(4, 8)), ()]:
      self.reads.clear()
      np.testing.assert_array_equal(big.read(None, region), self.big[region])
      self.assertLen(self.reads, 1)
      _, start, stop = self.reads[0]
      expected = np.zeros(self.big.shape, bool)
      expected[region] = True
      touched = np.flatnonzero(expected.reshape(-1))
      self.assertEqual((start - big.begin, stop - big.begin), (touched[0] * 2, (touched[-1] + 1) * 2))

  def test_a_block_of_a_grid_is_exact_and_cast(self):
    grid = self.source.tensors["grid"]
    np.testing.assert_array_equal(grid.read(ml_dtypes.bfloat16, (slice(8, 16), slice(4, 12))),
                                  self.grid[8:16, 4:12].astype(ml_dtypes.bfloat16))


if __name__ == "__main__":
  absltest.main()
