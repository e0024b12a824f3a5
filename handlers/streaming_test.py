"""The streaming writer on its own, its arrays in memory instead of Orbax's (whose save around it
leaf_handler_test.py runs): every block stored once and reported with its region, no more blocks alive than the
budget holds, a cancel or a failure stopping the save before its next block and naming the tensor, and each
process writing the bytes --dry_run shows for it."""

import asyncio
import threading
import time
import types
from typing import Any, Callable, Sequence
from unittest import mock

import numpy as np
import tensorstore as ts
from absl.testing import absltest

from handlers import host_databases, streaming
from handlers.lazy_tensor import Index, LazyTensor, LazyTensorLoadError, LazyTensorWriteError
from handlers.shares import Processes
from handlers.write_options import BlockWritten, SaveCancelled, WriteOptions

COLUMNS = 8
ROW_BYTES = COLUMNS * 4  # One float32 row: each loader's block, and each write block under the budgets below.
ONE_BLOCK = ROW_BYTES  # A budget that holds one block: blocks are read and written one after the other.
FOUR_BLOCKS = 4 * ROW_BYTES  # The writer cuts blocks of a quarter of its budget, so this keeps them one row each.


class _Rows:
  """A loader that computes one row at a time, calling `on_read(row)` first (from the writer's worker thread)."""

  def __init__(self, value: np.ndarray, on_read: Callable[[int], None] = lambda row: None):
    self.value = value
    self.block_shape = (1, value.shape[1])
    self.on_read = on_read

  def __call__(self) -> np.ndarray:
    return self.value

  def region(self, index: Index) -> np.ndarray:
    self.on_read(index[0].start)
    return self.value[index]


class _SlowReads:
  """An `on_read` that takes a while and counts the most reads under way at once (`peak`)."""

  def __init__(self):
    self._lock = threading.Lock()
    self._alive = 0
    self.peak = 0

  def __call__(self, row: int) -> None:
    del row
    with self._lock:
      self._alive += 1
      self.peak = max(self.peak, self._alive)
    time.sleep(0.02)
    with self._lock:
      self._alive -= 1


def _tensor(name: str, rows: int, on_read: Callable[[int], None] = lambda row: None) -> LazyTensor:
  value = np.arange(rows * COLUMNS, dtype=np.float32).reshape(rows, COLUMNS) + 1000 * len(name)
  return LazyTensor(name, value.shape, value.dtype, _Rows(value, on_read))


class _MemoryArrays:
  """Stands in for `streaming._open` (Orbax's array creation): each value's array in memory, its metadata a name."""

  def __init__(self):
    self.stores: dict[str, ts.TensorStore] = {}

  async def open(self, lazy: LazyTensor, block: tuple[int, ...], info: Any, arg: Any, metadata_key: str | None,
                 create: bool) -> tuple[ts.TensorStore, str]:
    del block, arg, metadata_key, create
    self.stores[info.name] = await ts.open(
        {"driver": "zarr3", "kvstore": {"driver": "memory"},
         "metadata": {"shape": list(lazy.shape), "data_type": lazy.dtype.name}}, create=True)
    return self.stores[info.name], f"metadata of {info.name}"


class _HostDatabases:
  """Stands in for `streaming._open`: each value's array in the writing process's database and in each restoring
  host's database (`database`), every database a memory store of its own."""

  def __init__(self):
    self.stores: dict[tuple[str, str | None], ts.TensorStore] = {}
    self.reported_unreadable: list[BlockWritten] = []

  async def open(self, lazy: LazyTensor, write: tuple[int, ...], info: Any, arg: Any, metadata_key: str | None,
                 create: bool, database: str | None = None) -> tuple[ts.TensorStore, str]:
    del arg, metadata_key, create
    self.stores[info.name, database] = await ts.open(  # One stored chunk per block of the writer's stored grid.
        {"driver": "zarr3", "kvstore": {"driver": "memory"}, "metadata": {
            "shape": list(lazy.shape), "data_type": lazy.dtype.name,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(write)}}}},
        create=True, context=ts.Context())
    return self.stores[info.name, database], f"metadata of {info.name}"

  def check_committed(self, event: BlockWritten) -> None:
    """Records `event` if any of its pieces is not yet readable outside the writer's transactions."""
    for start, stop, database in event.pieces:
      stored = self.stores[event.array_name, database][start[0]:stop[0]].read().result()
      if not stored.any():
        self.reported_unreadable.append(event)


class _ArraysFailingEveryWrite:
  """Stands in for `streaming._open`: arrays every write to which fails as tensorstore reports a storage error,
  with its spec appended."""

  async def open(self, *args: Any, **kwargs: Any) -> tuple["_ArraysFailingEveryWrite", None]:
    del args, kwargs
    return self, None

  def __getitem__(self, index: Index) -> "_ArraysFailingEveryWrite":
    return self

  async def write(self, block: np.ndarray, **kwargs: Any) -> None:
    del block, kwargs
    raise ValueError("UNAVAILABLE: disk gone [tensorstore_spec='{\"driver\": \"zarr3\", \"kvstore\": ...}']")


def _array_name(lazy: LazyTensor) -> str:
  return f"params.{lazy.name}"


def _save(values: Sequence[LazyTensor], budget: int, *, arrays: Any = None,
          written: list[BlockWritten] | None = None, on_written: Callable[[BlockWritten], None] | None = None,
          **options: Any) -> list[Any]:
  """Runs the writer as Orbax does, on an event loop of its own, each block reported written appended to `written`
  (after `on_written(block)`); returns the arrays' metadata."""
  arrays = arrays or _MemoryArrays()
  infos = [types.SimpleNamespace(name=_array_name(lazy), is_ocdbt_checkpoint=True) for lazy in values]

  def on_block_written(event: BlockWritten) -> None:
    if on_written is not None:
      on_written(event)
    if written is not None:
      written.append(event)

  with mock.patch.object(streaming, "_open", arrays.open):
    return asyncio.run(streaming.write_lazy_tensors(
        values, infos, [None] * len(values),
        options=WriteOptions(max_inflight_bytes=budget, on_block_written=on_block_written, **options)))


def _rows(written: Sequence[BlockWritten]) -> list[int]:
  return sorted(block.start[0] for block in written)


class WriteLazyTensorsTest(absltest.TestCase):

  def test_every_block_is_stored_once_and_reported_with_its_region(self):
    values = [_tensor("x", 6), _tensor("yy", 4)]
    arrays, written = _MemoryArrays(), []
    metadatas = _save(values, FOUR_BLOCKS, arrays=arrays, written=written)
    self.assertEqual(metadatas, ["metadata of params.x", "metadata of params.yy"])  # Orbax's, in value order.
    self.assertCountEqual(written, [BlockWritten(_array_name(lazy), (row, 0), (row + 1, COLUMNS), ROW_BYTES)
                                    for lazy in values for row in range(lazy.shape[0])])
    for lazy in values:
      np.testing.assert_array_equal(arrays.stores[_array_name(lazy)].read().result(), lazy.loader.value)

  def test_no_more_blocks_are_alive_than_the_budget_holds(self):
    reads, written = _SlowReads(), []
    _save([_tensor("x", 16, reads)], FOUR_BLOCKS, written=written)
    self.assertLen(written, 16)
    self.assertBetween(reads.peak, 2, 4)  # Reads overlap, four blocks at most (a block holds its bytes until stored).

  def test_a_cancel_stops_before_the_next_block_and_fails_the_save(self):
    cancel, rows_read, written = threading.Event(), [], []

    def cancel_at_row_2(row: int) -> None:
      rows_read.append(row)
      if row == 2:
        cancel.set()

    with self.assertRaises(SaveCancelled):
      _save([_tensor("x", 6, cancel_at_row_2)], ONE_BLOCK, written=written, cancel=cancel)
    self.assertEqual(rows_read, [0, 1, 2])  # Row 3 was waiting for the budget: never read.
    self.assertEqual(_rows(written), [0, 1, 2])  # The block in flight when the cancel came was still stored.

  def test_a_cancel_while_the_last_blocks_are_in_flight_still_fails_the_save(self):
    # Nothing is left to stop before, yet the save must not commit: the user asked for it to stop.
    cancel, written = threading.Event(), []

    def cancel_at_last_row(row: int) -> None:
      if row == 5:
        cancel.set()

    with self.assertRaises(SaveCancelled):
      _save([_tensor("x", 6, cancel_at_last_row)], FOUR_BLOCKS, written=written, cancel=cancel)
    self.assertLen(written, 6)

  def test_a_failing_loader_names_the_tensor_and_no_later_block_is_written(self):
    def fail_at_row_2(row: int) -> None:
      if row == 2:
        raise OSError("input vanished")

    written = []
    with self.assertRaisesRegex(LazyTensorLoadError, "^Failed to load tensor 'x': OSError: input vanished$"):
      _save([_tensor("x", 6, fail_at_row_2)], ONE_BLOCK, written=written)
    self.assertEqual(_rows(written), [0, 1])

  def test_a_failing_write_names_the_tensor_without_tensorstore_spec(self):
    written = []
    with self.assertRaisesRegex(LazyTensorWriteError,
                                "^Failed to write tensor 'x': ValueError: UNAVAILABLE: disk gone$"):
      _save([_tensor("x", 6)], ONE_BLOCK, arrays=_ArraysFailingEveryWrite(), written=written)
    self.assertEmpty(written)


class HostDatabasesTest(absltest.TestCase):

  def test_each_hosts_part_goes_to_its_own_database_and_is_reported_once_committed(self):
    value = _tensor("x", 8)
    # Two restoring hosts, four rows each; blocks of two rows (the budget's quarter) straddle no part.
    lazy = LazyTensor("x", value.shape, value.dtype, value.loader, chunk_shape=(1, COLUMNS), host_shape=(4, COLUMNS))
    arrays, written = _HostDatabases(), []
    _save([lazy], 8 * ROW_BYTES, arrays=arrays, written=written, on_written=arrays.check_committed)
    self.assertEmpty(arrays.reported_unreadable)  # Reported only once its round was committed.
    self.assertCountEqual([(event.start, event.stop) for event in written],
                          [((row, 0), (row + 2, COLUMNS)) for row in range(0, 8, 2)])
    for event in written:
      part = event.start[0] // 4
      self.assertEqual(event.pieces, ((event.start, event.stop, f"0p{part}"),))
    expected = value.loader.value
    for part in (0, 1):
      stored = arrays.stores[_array_name(lazy), f"0p{part}"].read().result()
      mine = slice(4 * part, 4 * part + 4)
      np.testing.assert_array_equal(stored[mine], expected[mine])
      self.assertFalse(np.delete(stored, np.s_[mine], axis=0).any())  # Nothing of the other host's part.
    self.assertFalse(arrays.stores[_array_name(lazy), None].read().result().any())

  def test_a_stored_block_of_several_blocks_pieces_is_committed_whole(self):
    # Two hosts, a half of the columns each; blocks of one row. A stored block holds two blocks' pieces (half the
    # budget): a round that ended between them would store the second piece alone, the first lost.
    value = _tensor("x", 12)
    lazy = LazyTensor("x", value.shape, value.dtype, value.loader, chunk_shape=(1, COLUMNS // 2),
                      host_shape=(12, COLUMNS // 2))
    arrays, written, rounds = _HostDatabases(), [], []
    commit = host_databases.CommitRounds._commit

    async def recorded(commit_rounds: host_databases.CommitRounds, closing: Any) -> None:
      await commit(commit_rounds, closing)
      rounds.append(sorted(task.result().start[0] for task in closing.tasks))

    with mock.patch.object(host_databases.CommitRounds, "_commit", recorded):
      _save([lazy], FOUR_BLOCKS, arrays=arrays, written=written, on_written=arrays.check_committed)
    self.assertEqual(arrays.stores[_array_name(lazy), "0p0"].chunk_layout.read_chunk.shape, (2, COLUMNS // 2))
    self.assertEqual(sorted(row for rows in rounds for row in rows), list(range(12)))
    for rows in rounds:  # Each round whole stored blocks: rows 2k and 2k + 1 together.
      self.assertEqual(rows, sorted({row // 2 * 2 + i for row in rows for i in (0, 1)}), rounds)
    self.assertLen(written, 12)
    self.assertEmpty(arrays.reported_unreadable)
    for part in (0, 1):
      columns = np.s_[:, COLUMNS // 2 * part:COLUMNS // 2 * (part + 1)]
      np.testing.assert_array_equal(arrays.stores[_array_name(lazy), f"0p{part}"].read().result()[columns],
                                    value.loader.value[columns])

  def test_a_block_across_parts_is_written_in_pieces_within_the_budget(self):
    reads = _SlowReads()
    value = _tensor("x", 16, reads)
    # Blocks of whole rows, each across both column halves' parts.
    lazy = LazyTensor("x", value.shape, value.dtype, value.loader, host_shape=(2, COLUMNS // 2))
    arrays, written = _HostDatabases(), []
    _save([lazy], FOUR_BLOCKS, arrays=arrays, written=written)
    self.assertLen(written, 16)
    self.assertBetween(reads.peak, 1, 4)  # A block holds its bytes until its round is committed.
    for event in written:
      row = event.start[0]
      self.assertEqual([database for _, _, database in event.pieces],
                       [f"0p{row // 2 * 2}", f"0p{row // 2 * 2 + 1}"])  # Parts in C order over a 8 x 2 grid.
    for part in range(16):
      rows, columns = divmod(part, 2)
      stored = arrays.stores[_array_name(lazy), f"0p{part}"].read().result()
      box = np.s_[2 * rows:2 * rows + 2, 4 * columns:4 * columns + 4]
      np.testing.assert_array_equal(stored[box], lazy.loader.value[box])
      stored[box] = 0
      self.assertFalse(stored.any())


class ShareBytesTest(absltest.TestCase):

  def test_each_process_writes_the_bytes_the_dry_run_shows_for_it(self):
    values = [_tensor("x", 40), _tensor("yy", 7), _tensor("zzz", 33)]
    for count in (2, 3):
      shown = streaming.share_bytes(values, FOUR_BLOCKS, count)
      written_by = []
      for index in range(count):
        written = []
        _save(values, FOUR_BLOCKS, written=written, processes=Processes(index=index, count=count))
        written_by.append(sum(block.nbytes for block in written))
      self.assertEqual(shown, written_by, count)
      self.assertEqual(sum(shown), sum(lazy.nbytes for lazy in values))
      self.assertNotIn(0, shown)


if __name__ == "__main__":
  absltest.main()
