"""A save's heap stays flat however many blocks it commits: each commit to an OCDBT database (one per block a save
writes) leaves new versions of the B-tree nodes on its path, and the contexts Orbax builds for a save cached them
until 100 MB of superseded versions had piled up. Measured with tensorstore alone, writing many small blocks into
one database as a save does, in the context Orbax builds for a save: stock (the control, which grows) and with
this package's resources added."""

import ctypes
import os
import tempfile

import numpy as np
import orbax.checkpoint as ocp
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


def heap_growth_writing(context: ts.Context, node_bytes: int | None = None) -> tuple[int, int]:
  """Bytes of live heap added by writing COMMITS blocks, ARRAYS arrays side by side, into one OCDBT database
  (its B-tree nodes capped at `node_bytes` decoded, if given), and the bytes the database holds at the end."""
  config = {} if node_bytes is None else {"config": {"max_decoded_node_bytes": node_bytes}}
  with tempfile.TemporaryDirectory() as directory:
    stores = []
    for a in range(ARRAYS):
      stores.append(ts.open({
          "driver": "zarr3", "create": True,
          "kvstore": {"driver": "ocdbt", "base": f"file://{directory}", "path": f"a{a}",
                      "cache_pool": "cache_pool#ocdbt", **config},
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
    stored = sum(entry.stat().st_size for entry in os.scandir(os.path.join(directory, "d")))
  return grown, stored


class SaveContextTest(absltest.TestCase):

  def test_commits_leave_no_cached_nodes_behind(self):
    storage_context.configure_saves({}, cache_btree_nodes=True)  # Orbax's own pool: the control.
    stock, _ = heap_growth_writing(storage_context.save_context())
    storage_context.configure_saves({})
    ours, _ = heap_growth_writing(storage_context.save_context())
    self.assertGreater(stock, 12 << 20, "the control no longer grows: the measurement shows nothing")
    self.assertLess(ours, 4 << 20)
    storage_context.configure_saves({}, cache_btree_nodes=True)  # A bucket's save: Orbax's pool.
    self.assertGreater(heap_growth_writing(storage_context.save_context())[0], 12 << 20)

  def test_each_process_database_caps_its_nodes_the_checkpoints_keeps_orbaxs(self):
    storage_context.configure_saves({})
    tree = {"a": np.arange(64, dtype=np.float32), "b": np.ones((4, 4), np.int32)}
    with tempfile.TemporaryDirectory() as directory:
      path = os.path.join(directory, "ckpt")
      ocp.v1.save_pytree(path, tree)
      path = os.path.join(path, "state")  # The pytree checkpointable.
      process = os.path.join(path, "ocdbt.process_0")
      self.assertEqual(_node_cap(process), storage_context.SAVE_BTREE_NODE_BYTES)
      self.assertEqual(_node_cap(path), 100_000_000)  # Orbax's, in the database readers traverse.
      restored = ocp.v1.load_pytree(os.path.dirname(path))
    for name, value in tree.items():
      np.testing.assert_array_equal(restored[name], value)


def _node_cap(directory: str) -> int:
  manifest = ts.ocdbt.dump(ts.KvStore.open(f"file://{directory}/").result()).result()
  return manifest["config"]["max_decoded_node_bytes"]


if __name__ == "__main__":
  absltest.main()
