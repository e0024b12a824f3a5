"""The reverse direction's read-ahead: pieces arrive in order, within the byte budget, and a read error reaches
the writer; its output is on disk before it is renamed into place."""

from __future__ import annotations

import itertools
import threading
import time
from unittest import mock

import numpy as np
from absl.testing import absltest

from converter.reverse import to_huggingface
from converter.sources.checkpoint_reader import CheckpointReader, StoredArray
from converter.errors import ConversionError
from converter.reverse.reverse_plan import HfPart, HfTensor

_PART = HfPart(("params", "params", "w"), (), (), None)


def _tensor(name: str, rows: int, pieces: int = 1) -> HfTensor:
  return HfTensor(name, (rows, 256), np.dtype(np.float32), tuple((_PART,) for _ in range(pieces)), pieces > 1, True)


class _Leaves:
  def keep_only(self, leaves):
    del leaves


class ReadAheadTest(absltest.TestCase):

  def run_read_ahead(self, items, max_bytes, piece):
    alive, peak, lock = [0], [0], threading.Lock()

    def reading(tensor, parts, leaves, merge):
      del parts, leaves, merge
      value = piece(tensor)
      with lock:
        alive[0] += value.nbytes
        peak[0] = max(peak[0], alive[0])
      return value

    got = []
    with mock.patch.object(to_huggingface, "_piece", reading):
      read_ahead = to_huggingface.ReadAhead(items, _Leaves(), max_bytes)
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


class _ChunkedReader:
  """A checkpoint's metadata (leaf shapes and stored chunk shapes) for `in_chunk_order`, with the real reader's
  arithmetic for the chunk a slice starts in."""

  def __init__(self, chunks: dict[tuple[str, ...], tuple[tuple[int, ...], tuple[int, ...]]]):
    self.arrays = {leaf: StoredArray(leaf, ".".join(leaf), shape, np.dtype(np.float32))
                   for leaf, (shape, _) in chunks.items()}
    self._chunks = {leaf: chunk for leaf, (_, chunk) in chunks.items()}

  def chunk_shape(self, array: StoredArray) -> tuple[int, ...]:
    return self._chunks[array.path]

  first_chunk = CheckpointReader.first_chunk


def _expert_tensors(leaf: tuple[str, ...], experts: int, layers: int) -> list[HfTensor]:
  """One HF tensor per (expert, layer) of a stacked expert leaf, in the plan's order: expert by expert."""
  return [HfTensor(f"{leaf[-1]}.{expert}.{layer}", (4, 3), np.dtype(np.float32),
                   ((HfPart(leaf, (expert, layer), (), None),),), False, True)
          for expert in range(experts) for layer in range(layers)]


class ChunkOrderTest(absltest.TestCase):
  WI, WO = ("params", "params", "wi"), ("params", "params", "wo")

  def test_chunks_of_several_experts_of_one_layer_are_each_read_in_one_run(self):
    reader = _ChunkedReader({self.WI: ((6, 5, 4, 3), (2, 1, 4, 3)), self.WO: ((6, 5, 3, 4), (6, 5, 3, 4))})
    tensors = _expert_tensors(self.WI, 6, 5) + _expert_tensors(self.WO, 6, 5)
    ordered = to_huggingface.in_chunk_order(tensors, reader)
    self.assertCountEqual([t.name for t in ordered], [t.name for t in tensors])
    wi = [t.pieces[0][0].index for t in ordered[:30]]
    # Layer 0's chunk of experts 0-1, then layer 1's; experts 2-3 only once every layer's chunk of 0-1 is done.
    self.assertEqual(wi[:4], [(0, 0), (1, 0), (0, 1), (1, 1)])
    chunks = [(expert // 2, layer) for expert, layer in wi]
    runs = [chunk for chunk, _ in itertools.groupby(chunks)]
    self.assertEqual(len(runs), len(set(chunks)))  # The plan's order enters each of these chunks twice.
    self.assertEqual(ordered[30:], tensors[30:])  # One chunk for the whole leaf: the plan's order stays.

  def test_chunks_spanning_every_layer_keep_the_plans_expert_order(self):
    reader = _ChunkedReader({self.WI: ((6, 5, 4, 3), (2, 5, 4, 3))})
    tensors = _expert_tensors(self.WI, 6, 5)
    self.assertEqual(to_huggingface.in_chunk_order(tensors, reader), tensors)

  def test_tensors_of_different_leaves_keep_their_order(self):
    reader = _ChunkedReader({self.WI: ((6, 5, 4, 3), (1, 1, 4, 3)), self.WO: ((6, 5, 3, 4), (1, 1, 3, 4))})
    tensors = _expert_tensors(self.WO, 6, 5) + _expert_tensors(self.WI, 6, 5)
    ordered = to_huggingface.in_chunk_order(tensors, reader)
    self.assertEqual([t.pieces[0][0].leaf for t in ordered], [self.WO] * 30 + [self.WI] * 30)


class _ConstantReader:
  """A checkpoint holding one leaf, `value`."""

  def __init__(self, keys: tuple[str, ...], value: np.ndarray):
    self.arrays = {keys: StoredArray(keys, ".".join(keys), value.shape, value.dtype)}
    self._value = value

  def open(self, array, index, cache_limit):
    del array, index, cache_limit
    return mock.Mock(read=lambda index: self._value)


class ConstantsTest(absltest.TestCase):
  NORM = ("params", "params", "decoder", "layers_0", "mhc_attention", "mhc_norm", "scale")

  def check(self, value: np.ndarray) -> None:
    plan = mock.Mock(constants=((self.NORM, 1.0),), items_path="OUT/0/items",
                     config=mock.Mock(architecture="DeepseekV4ForCausalLM"))
    to_huggingface.check_constants(plan, _ConstantReader(self.NORM, value), 1 << 20)

  def test_a_leaf_at_its_fixed_value_passes(self):
    self.check(np.ones((768,), np.float32))

  def test_a_leaf_trained_away_from_its_fixed_value_is_refused(self):
    value = np.ones((768,), np.float32)
    value[5] = 1.25
    with self.assertRaisesRegex(ConversionError, r"mhc_norm/scale is not 1 everywhere \(max\|leaf - 1\| = 0\.25\);"
                                r" DeepseekV4ForCausalLM has no tensor for it"):
      self.check(value)


if __name__ == "__main__":
  absltest.main()
