"""Tests of writing behind: the bytes are exact, written pages leave the page cache, no descriptor is left open."""

from __future__ import annotations

import ctypes
import mmap
import os
import tempfile
import threading
import tracemalloc
from unittest import mock

import numpy as np
from absl.testing import absltest

from converter import write_behind

_PAGE = os.sysconf("SC_PAGE_SIZE")
_LIBC = ctypes.CDLL(None, use_errno=True)


def resident_pages(path: str) -> np.ndarray:
  """Per page of `path`, whether it is in the page cache (mincore on a private map, which faults nothing in)."""
  size = os.path.getsize(path)
  vector = (ctypes.c_ubyte * -(-size // _PAGE))()
  with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
    start = ctypes.c_char.from_buffer(mapped)
    try:
      if _LIBC.mincore(ctypes.c_void_p(ctypes.addressof(start)), ctypes.c_size_t(size), vector) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    finally:
      del start  # The map cannot close while a ctypes object points into it.
  return np.frombuffer(bytes(vector), np.uint8) & 1


def open_descriptors() -> int:
  return len(os.listdir("/proc/self/fd"))


@absltest.skipUnless(write_behind.AVAILABLE, "sync_file_range is Linux's")
class WriteBehindTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    probe = os.path.join(self.dir, "probe")
    with open(probe, "wb") as f:
      f.write(os.urandom(16 * _PAGE))
      f.flush()
      os.fsync(f.fileno())
      os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if resident_pages(probe).any():
      self.skipTest("this filesystem keeps written pages cached whatever one advises (tmpfs?)")
    os.remove(probe)

  def test_a_file_written_behind_holds_every_byte_and_keeps_a_few_windows_cached(self):
    window = 16 * _PAGE
    lag = write_behind.DEFAULT_LAG
    data = np.random.default_rng(0).integers(0, 256, 40 * window + 12345, dtype=np.uint8)
    path = os.path.join(self.dir, "out.bin")
    out = write_behind.WriteBehindFile(path, window=window)
    piece = window * 3 // 7 + 5  # Odd sizes, across pages.
    cuts = list(range(0, data.nbytes, piece)) + [data.nbytes]
    most_resident = 0
    for start, stop in zip(cuts, cuts[1:]):
      self.assertEqual(out.write(data[start:stop]), stop - start)
      most_resident = max(most_resident, int(resident_pages(path).sum()))
    self.assertEqual(out.tell(), data.nbytes)
    out.close()
    resident = resident_pages(path)  # Before reading it back, which caches it again.
    # The window being written and lag + 1 behind it, each ending with the first write past a window's bytes.
    self.assertLessEqual(most_resident, (lag + 2) * (window + piece) // _PAGE + 2)
    self.assertGreater(most_resident, window // _PAGE)
    self.assertFalse(resident[: data.nbytes // 2 // _PAGE].any())
    self.assertTrue(resident[-1])  # The last windows stay cached: nothing waited for them.
    with open(path, "rb") as f:
      np.testing.assert_array_equal(np.frombuffer(f.read(), np.uint8), data)

  def test_a_filesystem_without_sync_file_range_gets_plain_writes(self):
    data = np.random.default_rng(2).integers(0, 256, 8 * 16 * _PAGE, dtype=np.uint8)
    path = os.path.join(self.dir, "plain.bin")
    with mock.patch.object(write_behind, "_SYNC_FILE_RANGE", lambda *args: -1), \
         self.assertLogs(level="WARNING") as logs:
      out = write_behind.WriteBehindFile(path, window=16 * _PAGE)
      for piece in np.split(data, 16):
        out.write(piece)
      out.close()
    self.assertLen(logs.records, 1)
    self.assertIn("written plainly from byte", logs.output[0])
    with open(path, "rb") as f:
      np.testing.assert_array_equal(np.frombuffer(f.read(), np.uint8), data)

  def test_closing_a_file_waits_until_its_bytes_are_on_disk(self):
    synced = []
    path = os.path.join(self.dir, "out.bin")
    out = write_behind.WriteBehindFile(path, window=16 * _PAGE)
    out.write(b"x" * (40 * _PAGE))
    descriptor = out.fileno()
    real_fsync = os.fsync
    with mock.patch.object(os, "fsync", lambda fd: (synced.append((fd, os.fstat(fd).st_size)), real_fsync(fd))):
      out.close()
    self.assertEqual(synced, [(descriptor, 40 * _PAGE)])  # The whole file, before the descriptor closed.

  def test_a_file_needs_a_lag_of_a_window_at_least(self):
    with self.assertRaisesRegex(ValueError, "lag"):
      write_behind.WriteBehindFile(os.path.join(self.dir, "x"), lag=0)

  def test_a_directory_written_behind_drops_its_data_files_only_and_closes_what_it_opened(self):
    data_dir = os.path.join(self.dir, "tmp-step", "ocdbt.process_0", "d")
    os.makedirs(data_dir)
    other = os.path.join(self.dir, "tmp-step", "manifest")
    chunk = np.random.default_rng(1).integers(0, 256, 32 * _PAGE, dtype=np.uint8).tobytes()
    descriptors = open_descriptors()
    finished = threading.Event()

    def write_files():  # As tensorstore does: data files appear and grow while the watcher runs.
      with open(os.path.join(data_dir, "f" * 32), "wb") as f:  # Seen empty for a few rounds, then written.
        finished.wait(0.05)
        for _ in range(4):
          f.write(chunk)
      for i in range(6):
        with open(os.path.join(data_dir, f"{i:032x}"), "wb") as f:
          for _ in range(4):
            f.write(chunk)
            f.flush()
            finished.wait(0.03)
      with open(other, "wb") as f:
        f.write(chunk)

    with write_behind.WriteBehindDirectory(self.dir, interval=0.01) as behind:
      writer = threading.Thread(target=write_files)
      writer.start()
      writer.join()
      for _ in range(500):  # Two rounds see each file unchanged: it is dropped and closed.
        if not behind._open and len(behind._done) + len(behind._settled) == 7:  # pylint: disable=protected-access
          break
        finished.wait(0.02)
      os.rename(os.path.join(self.dir, "tmp-step"), os.path.join(self.dir, "step"))  # Orbax's commit.
      finished.wait(0.05)
    self.assertEqual(open_descriptors(), descriptors)
    data_dir = os.path.join(self.dir, "step", "ocdbt.process_0", "d")
    names = sorted(os.listdir(data_dir))
    self.assertLen(names, 7)
    for name in names:
      path = os.path.join(data_dir, name)
      self.assertFalse(resident_pages(path).any(), name)
      with open(path, "rb") as f:
        self.assertEqual(f.read(), chunk * 4, name)
    self.assertTrue(resident_pages(os.path.join(self.dir, "step", "manifest")).all())


  def test_a_settled_file_costs_its_inode_alone_and_a_round_holds_no_listing(self):
    data_dir = os.path.join(self.dir, "step", "ocdbt.process_0", "d")
    os.makedirs(data_dir)
    behind = write_behind.WriteBehindDirectory(self.dir)
    with mock.patch.object(write_behind, "_SETTLED_S", 0.0):
      for batch in range(4):  # As a save leaves them: a few at a time, each written once.
        for i in range(1000):
          with open(os.path.join(data_dir, f"{batch:04x}{i:028x}"), "wb") as f:
            f.write(b"x")
        for _ in range(3):  # Opened and started; found unchanged and closed; settled.
          behind._round()  # pylint: disable=protected-access
      self.assertLen(behind._settled, 4000)  # pylint: disable=protected-access
      self.assertEqual((behind._open, behind._done), ({}, {}))  # pylint: disable=protected-access
      tracemalloc.start()
      try:
        behind._round()  # pylint: disable=protected-access
        held, peak = tracemalloc.get_traced_memory()
      finally:
        tracemalloc.stop()
    # Listed whole, a round held a tuple, a path and a directory entry of each file (about 400 bytes apiece).
    self.assertLess(peak, 64 << 10)
    self.assertLess(held, 4 << 10)


if __name__ == "__main__":
  absltest.main()
