"""The bytes the codec floor encodes: the input's own, cut into pieces from each file's start, shared between
processes piece by piece, read as views of the files (a floor that encoded other bytes than the input's, or copied
them where a conversion does not, would be no floor)."""

import os

import numpy as np
from absl.testing import absltest

from tools import floors


class FloorPiecesTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    directory = self.create_tempdir().full_path
    self.first, self.second = os.urandom(20), os.urandom(6)
    self.files = []
    for name, data in (("a.safetensors", self.first), ("b.safetensors", self.second)):
      self.files.append(os.path.join(directory, name))
      with open(self.files[-1], "wb") as f:
        f.write(data)

  def _pieces(self, count: int, share: int = 0, shares: int = 1) -> list[bytes]:
    return [p.tobytes() for p in floors.floor_pieces(self.files, count, 8, share, shares)]

  def test_pieces_cut_each_file_from_its_start_pad_its_last_and_start_again(self):
    pad = lambda b: b + bytes(8 - len(b))
    a, b = self.first, self.second
    self.assertEqual(self._pieces(6), [a[:8], a[8:16], pad(a[16:]), pad(b), a[:8], a[8:16]])

  def test_a_share_takes_every_shares_th_piece_counted_across_passes(self):
    pad = lambda b: b + bytes(8 - len(b))
    self.assertEqual(self._pieces(3, share=1, shares=2), [self.first[8:16], pad(self.second), self.first[8:16]])

  def test_whole_pieces_are_read_only_views_of_the_files_not_copies(self):
    whole = next(floors.floor_pieces(self.files, 1, 8))
    self.assertFalse(whole.flags.owndata)
    self.assertFalse(whole.flags.writeable)
    self.assertEqual(whole.dtype, np.uint16)

  def test_files_without_bytes_are_refused_instead_of_looping(self):
    empty = os.path.join(self.create_tempdir().full_path, "empty.safetensors")
    open(empty, "wb").close()
    with self.assertRaisesRegex(ValueError, "no bytes"):
      next(floors.floor_pieces([empty], 1, 8))


class FloorsRunTest(absltest.TestCase):
  """Each floor run end to end on a small input: what the benchmark calls, with the seconds it reports."""

  def test_the_codec_and_copy_floors_measure_the_inputs_bytes(self):
    directory, scratch = self.create_tempdir().full_path, self.create_tempdir().full_path
    with open(os.path.join(directory, "model.safetensors"), "wb") as f:
      f.write(np.random.default_rng(0).integers(0, 1 << 16, 1 << 20, np.uint16).tobytes())
    encode, decode, encode_cpu, decode_cpu = floors.compression_floors(directory, 2 << 20, scratch, 0, 1, True, 1)
    self.assertTrue(all(value > 0 for value in (encode, decode, encode_cpu, decode_cpu)))
    self.assertEqual(os.listdir(scratch), [])  # Its arrays and decoded file removed.
    self.assertGreater(floors.decode_floor(directory, 2 << 20, level=1), 0)  # One piece: the file, padded.
    seconds, cpu = floors.copy_floor(directory, 2 << 20)
    self.assertGreater(seconds, 0)
    self.assertGreaterEqual(cpu, 0)


if __name__ == "__main__":
  absltest.main()
