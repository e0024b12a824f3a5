"""The reverse direction's read-ahead: pieces arrive in order, within the byte budget, and a read error reaches
the writer; its output is on disk before it is renamed into place."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from unittest import mock

import numpy as np
from absl.testing import absltest

from converter import to_huggingface
from converter.errors import ConversionError
from converter.reverse_plan import HfPart, HfTensor

_PART = HfPart(("params", "params", "w"), (), (), None)


def _tensor(name: str, rows: int, pieces: int = 1) -> HfTensor:
  return HfTensor(name, (rows, 256), np.dtype(np.float32), tuple((_PART,) for _ in range(pieces)), pieces > 1, True)


class _Leaves:
  def keep_only(self, leaves):
    del leaves


class ReadAheadTest(absltest.TestCase):

  def run_read_ahead(self, items, max_bytes, piece):
    alive, peak, lock = [0], [0], threading.Lock()

    def reading(tensor, parts, leaves):
      del parts, leaves
      value = piece(tensor)
      with lock:
        alive[0] += value.nbytes
        peak[0] = max(peak[0], alive[0])
      return value

    got = []
    with mock.patch.object(to_huggingface, "_piece", reading):
      read_ahead = to_huggingface._ReadAhead(items, _Leaves(), max_bytes)
      try:
        for tensor, value in read_ahead:
          time.sleep(0.002)  # A slow writer: the reader runs as far ahead as the budget lets it.
          got.append((tensor.name, value.nbytes))
          with lock:
            alive[0] -= value.nbytes
      finally:
        read_ahead.close()
    return got, peak[0]

  def test_pieces_arrive_in_order_within_the_budget(self):
    items = [(t, parts) for t in (_tensor(f"t{i}", 64 * (1 + i % 3), pieces=1 + i % 2) for i in range(30))
             for parts in t.pieces]
    piece = lambda t: np.zeros((t.shape[0] // len(t.pieces), 256), np.float32)
    got, peak = self.run_read_ahead(items, 1 << 20, piece)
    self.assertEqual([name for name, _ in got], [t.name for t, _ in items])
    self.assertLessEqual(peak, 1 << 20)
    self.assertGreater(peak, 2 * max(piece(t).nbytes for t, _ in items))  # It did read ahead.

  def test_a_piece_larger_than_the_budget_passes_alone(self):
    items = [(_tensor("big", 4096), (_PART,)), (_tensor("small", 8), (_PART,))]
    got, peak = self.run_read_ahead(items, 1 << 16, lambda t: np.zeros(t.shape, np.float32))
    self.assertEqual([name for name, _ in got], ["big", "small"])
    self.assertEqual(peak, 4096 * 256 * 4)

  def test_a_read_error_reaches_the_writer(self):
    def piece(tensor):
      if tensor.name == "t2":
        raise ConversionError("leaf x: damaged chunk")
      return np.zeros((1, 256), np.float32)

    items = [(_tensor(f"t{i}", 1), (_PART,)) for i in range(5)]
    with self.assertRaisesRegex(ConversionError, "damaged chunk"):
      self.run_read_ahead(items, 1 << 20, piece)


class PublishTest(absltest.TestCase):

  def test_everything_is_synced_before_the_rename_and_the_rename_after(self):
    parent = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    staging, output_dir = os.path.join(parent, ".out.tmp"), os.path.join(parent, "out")
    os.makedirs(staging)
    for name in ("model-00001-of-00002.safetensors", to_huggingface.INDEX_FILE, "config.json"):
      with open(os.path.join(staging, name), "w") as f:
        f.write("{}")
    events = []
    real_rename = os.rename
    with mock.patch.object(to_huggingface, "_sync", lambda path: events.append(("sync", path))), \
         mock.patch.object(os, "rename", lambda a, b: (events.append(("rename", b)), real_rename(a, b))):
      to_huggingface._publish(staging, output_dir)
    self.assertEqual(events, [("sync", os.path.join(staging, to_huggingface.INDEX_FILE)),
                              ("sync", os.path.join(staging, "config.json")), ("sync", staging),
                              ("rename", output_dir), ("sync", parent)])
    self.assertTrue(os.path.isfile(os.path.join(output_dir, "config.json")))


if __name__ == "__main__":
  absltest.main()
