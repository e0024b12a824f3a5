"""--dry_run's memory model on the way back: ReadAhead's window and the open leaves' chunk caches."""

from unittest import mock

import numpy as np
from absl.testing import absltest

from converter.options import ReverseOptions
from converter.reverse import dry_run
from converter.reverse.reverse_plan import HfPart, HfTensor
from converter.sources.checkpoint_reader import StoredArray

MIB = 1 << 20


def _way_back(leaves: dict[str, tuple[int, int]], tensors: list[tuple[str, str, int]]):
  """Leaves name -> (bytes, chunk bytes), float32 1-D; tensors (name, leaf, bytes), one piece each, one shard."""
  arrays = {(leaf,): StoredArray((leaf,), leaf, (size // 4,), np.dtype(np.float32))
            for leaf, (size, _) in leaves.items()}
  reader = mock.Mock(arrays=arrays, chunk_shape=lambda array: (leaves[array.name][1] // 4,))
  shard = tuple(HfTensor(name, (size // 4,), np.dtype(np.float32), ((HfPart((leaf,), (), (), None),),), False, True)
                for name, leaf, size in tensors)
  return mock.Mock(reader=reader, shards=(shard,), merge=None)


class PredictedPeakTest(absltest.TestCase):

  def test_pieces_in_flight_are_bounded_by_the_budget_and_caches_by_the_open_leaves(self):
    way_back = _way_back({"a": (8 * MIB, MIB), "b": (8 * MIB, MIB)},
                         [("a0", "a", 4 * MIB), ("a1", "a", 4 * MIB), ("b0", "b", 4 * MIB), ("b1", "b", 4 * MIB)])
    peak, caches = dry_run.predicted_peak_bytes(way_back, ReverseOptions(read_ahead_bytes=8 * MIB), baseline_bytes=0)
    self.assertEqual(caches, 16 * MIB)  # a1 and b0 in flight together: both leaves open, each cached whole.
    self.assertEqual(peak, dry_run.WRITER_BYTES + dry_run.INFLIGHT_OVERHEAD * 8 * MIB + 16 * MIB)

  def test_a_piece_larger_than_the_budget_still_counts_whole_and_a_cache_is_capped(self):
    way_back = _way_back({"a": (64 * MIB, MIB)}, [("a", "a", 64 * MIB)])
    options = ReverseOptions(read_ahead_bytes=MIB, read_cache_bytes=4 * MIB)
    peak, caches = dry_run.predicted_peak_bytes(way_back, options, baseline_bytes=10)
    self.assertBetween(caches, 4 * MIB, 6 * MIB)  # The cache's size with TensorStore's headroom, not the leaf.
    self.assertEqual(peak, 10 + dry_run.WRITER_BYTES + dry_run.INFLIGHT_OVERHEAD * 64 * MIB + caches)


if __name__ == "__main__":
  absltest.main()
