"""A host restoring its share of a checkpoint from a bucket fetches that share once, not its neighbours' too.

Orbax reads buckets with tensorstore's read coalescing on (reads of one object issued within 1 ms and at most 1 MB
apart become one request, the gap included; converter/sources/orbax_format.py's read spec mirrors it). A layout whose
stored blocks interleave the hosts' parts in pieces under 1 MB makes every host fetch its neighbours' bytes too
(2.3x on a 0.84 GB Llama at fsdp=16 with the 16 simulated devices' blocks, docs/loading-on-a-pod.md). Here one
host's share (the first quarter of every leaf's `fsdp` axis: hosts of 4 devices on fsdp=16) of a 45 MB Llama's
largest leaves is read from the GCS emulator through a counting proxy, against what reading each whole leaf
fetches: a quarter, as the default layout promises, and all of it for the layout before chunks (whole write blocks).
"""

from __future__ import annotations

import os

from absl.testing import absltest

from converter.layout import chunking
from converter.sources.checkpoint_reader import CheckpointReader
from converter.checkpoint_format.record import ConversionRecord
from integration_tests import harness
from tools import gcs_emulator, synthetic_checkpoint
from tools.request_proxy import RequestProxy

_LEAVES = ("decoder/layers/mlp/wi_0/kernel", "decoder/layers/mlp/wo/kernel", "decoder/layers/self_attention/out/kernel",
           "token_embedder/embedding")
_HOSTS = 4  # fsdp=16, hosts of 4 devices: host 0 restores the first quarter of each fsdp axis.


class BucketRestoreTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    config = synthetic_checkpoint.llama_config(hidden=1024, layers=2, intermediate=4096, heads=8, kv_heads=4,
                                               vocab=8192)
    model = harness.scratch_dir("bucket-restore-hf-")
    synthetic_checkpoint.write_checkpoint(model, config, list(synthetic_checkpoint.llama_shapes(config)))
    cls.gcs = gcs_emulator.GcsEmulator(root=harness.scratch_dir("bucket-restore-gcs-"))
    cls.gcs.start()
    cls.gcs.create_bucket("ckpts")
    for name, flags in (("default", ()), ("write_blocks", ("--nochunk_layout",))):
      out = os.path.join(harness.scratch_dir(f"bucket-restore-{name}-"), "out")
      harness.run_converter(f"--hf_model_path={model}", f"--output_dir={out}", "--noprogress", *flags)
      cls.gcs.upload_dir(out, "ckpts", name)
    cls.proxy = RequestProxy(cls.gcs.url).start()
    cls.environ = os.environ.copy()
    os.environ.update(cls.gcs.env)
    os.environ["TENSORSTORE_GCS_HTTP_URL"] = cls.proxy.url  # tensorstore's reads only; metadata goes around.

  @classmethod
  def tearDownClass(cls):
    os.environ.clear()
    os.environ.update(cls.environ)
    cls.proxy.stop()
    cls.gcs.stop()
    super().tearDownClass()

  def fetched(self, layout: str, leaf: str, host_share: bool) -> int:
    """Bytes fetched from the bucket reading `leaf` (or host 0's share of it) with a fresh reader (no cache)."""
    reader = CheckpointReader(f"gs://ckpts/{layout}/0/items")
    key = next(k for k in reader.arrays if "/".join(k).endswith(leaf))
    array = reader.arrays[key]
    index = tuple(slice(None) for _ in array.shape)
    if host_share:
      axes = ConversionRecord.read(reader.items_path).logical_axes[leaf]
      axis = next(a for a, mesh in enumerate(chunking.mesh_axes(axes)) if "fsdp" in mesh)
      index = index[:axis] + (slice(0, array.shape[axis] // _HOSTS),) + index[axis + 1:]
    before = self.proxy.counts.get_bytes
    reader.open(array, index, 64 << 20).read(index)
    return self.proxy.counts.get_bytes - before

  def test_a_host_fetches_its_share_once(self):
    for leaf in _LEAVES:
      whole, share = self.fetched("default", leaf, False), self.fetched("default", leaf, True)
      # The share's own bytes, and the shard indexes and B-tree nodes its reads pass through.
      self.assertLess(share, whole / _HOSTS * 1.1 + (64 << 10), leaf)

  def test_the_layout_before_chunks_fetches_whole_blocks(self):
    # Without read chunks a host decodes whole write blocks: the same check fails, so it can.
    leaf = "decoder/layers/mlp/wo/kernel"
    whole, share = self.fetched("write_blocks", leaf, False), self.fetched("write_blocks", leaf, True)
    self.assertGreater(share, whole / _HOSTS * 2)


if __name__ == "__main__":
  absltest.main()
