"""A save's heap stays flat however many blocks it commits: each commit to an OCDBT database (one per block a save
writes) leaves new versions of the B-tree nodes on its path, and the contexts Orbax builds for a save cached them
until 100 MB of superseded versions had piled up. Measured with tensorstore alone, writing many small blocks into
one database as a save does, in the context Orbax builds for a save: stock (the control, which grows) and with
this package's resources added."""

import ctypes
import tempfile

import numpy as np
import tensorstore as ts
from absl.testing import absltest

from handlers import storage_context


class MallInfo2(ctypes.Structure):
  _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                            "fsmblks", "uordblks", "fordblks", "keepcost")]


_mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
_mallinfo2.restype = MallInfo2

ARRAYS = 4
COMMITS = 1500  # Blocks written in all; stock, the heap grew about 30 KiB a commit (89 MiB over 3000).
ROWS, COLUMNS = 8, 256  # 4 KiB blocks of bfloat16: what grows is set by the commits, not by their bytes.


def heap_growth_writing(context: ts.Context) -> int:
  """Bytes of live heap added by writing COMMITS blocks, ARRAYS arrays side by side, into one OCDBT database."""
  with tempfile.TemporaryDirectory() as directory:
    stores = []
    for a in range(ARRAYS):
      stores.append(ts.open({
          "driver": "zarr3", "create": True,
          "kvstore": {"driver": "ocdbt", "base": f"file://{directory}", "path": f"a{a}",
                      "cache_pool": "cache_pool#ocdbt"},
          "metadata": {"shape": [ROWS * COMMITS // ARRAYS, COLUMNS], "data_type": "bfloat16",
                       "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [ROWS, COLUMNS]}},
                       "codecs": [{"name": "bytes"}, {"name": "zstd", "configuration": {"level": 1}}]},
      }, context=context).result())
    block = np.random.default_rng(0).standard_normal((ROWS, COLUMNS)).astype(ts.bfloat16.numpy_dtype)
    before = _mallinfo2().uordblks
    for i in range(COMMITS // ARRAYS):
      for write in [store[i * ROWS:(i + 1) * ROWS].write(block) for store in stores]:
        write.result()
    grown = _mallinfo2().uordblks - before
    del stores
  return grown


class SaveContextTest(absltest.TestCase):

  def test_commits_leave_no_cached_nodes_behind(self):
    stock = heap_growth_writing(storage_context.save_context())  # Before this package's resources are added.
    storage_context.add_tensorstore_resources({})
    ours = heap_growth_writing(storage_context.save_context())
    self.assertGreater(stock, 12 << 20, "the control no longer grows: the measurement shows nothing")
    self.assertLess(ours, 4 << 20)
    storage_context.add_tensorstore_resources({}, cache_btree_nodes=True)  # A bucket's save: Orbax's pool.
    self.assertGreater(heap_growth_writing(storage_context.save_context()), 12 << 20)


if __name__ == "__main__":
  absltest.main()
