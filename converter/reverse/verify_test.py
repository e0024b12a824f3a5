"""--verify on the way back: written files compared piece by piece with the pieces recomputed (here, given)."""

import json
import os
import tempfile
from unittest import mock

import numpy as np
from absl.testing import absltest

from converter.options import ReverseOptions
from converter.reverse import verify
from converter.reverse.reverse_plan import HfPart, HfTensor
from converter.reverse.safetensors_output import INDEX_FILE, SafetensorsStreamWriter, index_json
from converter.reverse.to_huggingface import ToHuggingFaceResult

_VALUES = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.arange(6, dtype=np.float32) / 7}


def _tensor(name: str, in_pieces: bool) -> HfTensor:
  value = _VALUES[name]
  pieces = [(HfPart((name,), (row,), (), None),) for row in range(len(value))] if in_pieces else [
      (HfPart((name,), (), (), None),)]
  return HfTensor(name, value.shape, value.dtype, tuple(pieces), in_pieces, True)


class _Pieces:
  """ReadAhead's stand-in: each piece's value, a row of a tensor in pieces or the whole tensor."""

  def __init__(self, items, leaves, max_bytes, merge):
    del leaves, max_bytes, merge
    self._items = items

  def __iter__(self):
    for tensor, parts in self._items:
      value = _VALUES[tensor.name]
      yield tensor, value[parts[0].index[0]] if tensor.in_pieces else value

  def close(self):
    pass


class VerifyWrittenTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.out = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    shards = ((_tensor("a", in_pieces=True),), (_tensor("b", in_pieces=False),))
    files = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    for name, shard in zip(files, shards):
      writer = SafetensorsStreamWriter(os.path.join(self.out, name), [t.spec for t in shard])
      for tensor in shard:
        writer.write(tensor.name, _VALUES[tensor.name])
      writer.close()
    index = index_json([t.spec for s in shards for t in s], {"a": files[0], "b": files[1]})
    with open(os.path.join(self.out, INDEX_FILE), "w") as f:
      json.dump(index, f)
    plan = mock.Mock(items_path="/unused")
    self.result = ToHuggingFaceResult(plan, self.out, files, 0, files, shards=shards)
    for patch in (mock.patch.object(verify, "ReadAhead", _Pieces),
                  mock.patch("converter.sources.checkpoint_reader.CheckpointReader")):
      patch.start()
      self.addCleanup(patch.stop)

  def test_intact_files_verify_every_tensor_and_byte(self):
    report = verify.verify_written(self.result, ReverseOptions())
    self.assertEqual((report.tensors, report.bytes, report.mismatches), (2, 72, ()))

  def test_a_changed_byte_is_named_by_tensor_piece_and_element(self):
    path = os.path.join(self.out, self.result.files[0])
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
      f.seek(size - 8)  # Row 2, element 2 of "a".
      f.write(b"\xff")
    report = verify.verify_written(self.result, ReverseOptions())
    self.assertLen(report.mismatches, 1)
    self.assertIn("a in model-00001-of-00002.safetensors (from a), bytes 32..48: 1 differing values, first at (2,)",
                  report.mismatches[0])
    self.assertEqual(report.tensors, 1)

  def test_a_truncated_file_a_wrong_header_and_a_wrong_index_are_reported(self):
    path = os.path.join(self.out, self.result.files[1])
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) - 4)
    with open(os.path.join(self.out, INDEX_FILE), "w") as f:
      json.dump({"weight_map": {"a": self.result.files[1], "b": self.result.files[1]}}, f)
    mismatches = verify.verify_written(self.result, ReverseOptions()).mismatches
    self.assertLen(mismatches, 2)
    self.assertIn("weight_map differs from the plan for 1 tensors, e.g. a", mismatches[0])
    self.assertIn("truncated file", mismatches[1])


if __name__ == "__main__":
  absltest.main()
