"""Chunk grids and the read amplification they cause, against target-mesh-notes.md's measured Qwen3 layouts."""

import math

from absl.testing import absltest, parameterized

from converter.layout import chunking
from converter.errors import ConversionError

WI = ((2048, 16, 6144), ("embed", "layers", "mlp"))  # Qwen3 1.8B-like, scanned: (embed, layers, mlp).
WO = ((6144, 16, 2048), ("mlp", "layers", "embed"))
MOE_WI = ((128, 2048, 48, 768), ("exp", "embed_moe", "layers", "mlp_moe"))
BF16 = 2


def amplification(shape, axes, chunk, mesh):
  dedup, worst = chunking.read_bytes(shape, chunk, BF16, axes, mesh)
  return dedup / (math.prod(shape) * BF16), worst / (math.prod(shape) * BF16)


class MeshAxesTest(absltest.TestCase):

  def test_default_rules_as_maxtext_assigns_them(self):
    self.assertEqual(chunking.mesh_axes(WI[1])[0], ("fsdp", "context", "context_usp_ulysses", "expert"))
    self.assertEqual(chunking.mesh_axes(WI[1])[2], ("fsdp_transpose", "tensor", "tensor_sequence", "autoregressive"))
    # An expert weight: `exp` takes `expert`, so its embed_moe axis gets fsdp without it.
    self.assertEqual(chunking.mesh_axes(MOE_WI[1])[:2], (("expert",), ("fsdp", "context", "context_usp_ulysses")))
    self.assertEqual(chunking.mesh_axes(("norm", "layers")), (("tensor",), ("stage",)))

  def test_target_mesh_is_parsed_in_maxtext_device_order(self):
    self.assertEqual(chunking.parse_mesh("expert=8,fsdp=64,tensor=4"), (("fsdp", 64), ("tensor", 4), ("expert", 8)))
    for bad in ("fsdp", "fsdp=0", "pipeline=2", "fsdp=2,fsdp=4", ""):
      with self.assertRaises(ConversionError, msg=bad):
        chunking.parse_mesh(bad)


class ChunkShapeTest(absltest.TestCase):

  def test_default_cuts_fsdp_axes_one_layer_at_a_time(self):
    rule = chunking.ChunkRule()
    self.assertEqual(rule.chunk_shape(*WI, BF16), (32, 1, 6144))
    self.assertEqual(rule.chunk_shape(*WO, BF16), (6144, 1, 32))
    self.assertEqual(rule.chunk_shape(*MOE_WI, BF16), (1, 32, 1, 768))

  def test_floor_and_ceiling(self):
    rule = chunking.ChunkRule()
    # 32 rows of (2048, 64) would be 4 KiB: fewer pieces, above the 32 KiB floor.
    self.assertEqual(rule.chunk_shape((2048, 64), ("embed", "kv"), BF16), (256, 64))
    # A (151936, 2048) embedding: 32 columns of every row is 9.7 MB; the vocab axis is cut too.
    chunk = rule.chunk_shape((151936, 2048), ("vocab", "embed"), BF16)
    self.assertEqual(chunk[1], 32)
    self.assertLessEqual(math.prod(chunk) * BF16, rule.max_chunk_bytes)
    self.assertEqual(151936 % chunk[0], 0)
    # An odd vocabulary stays whole; its embed axis is cut as far as the floor allows.
    self.assertEqual(rule.chunk_shape((509, 256), ("vocab", "embed"), BF16), (509, 64))

  def test_chunks_are_laid_out_with_the_axes_a_mesh_cuts_outermost(self):
    rule = chunking.ChunkRule()
    self.assertIsNone(rule.chunk_order(WI[1]))  # (embed, layers, mlp): already embed-major.
    self.assertEqual(rule.chunk_order(WO[1]), (2, 0, 1))  # (mlp, layers, embed) -> embed, mlp, layers.
    self.assertEqual(rule.chunk_order(("heads", "layers", "kv", "embed_attn")), (3, 0, 1, 2))
    self.assertEqual(rule.chunk_order(("vocab", "embed_vocab")), (1, 0))
    # (exp, embed_moe, layers, mlp_moe): a block of several experts holds a host's rows of them all in one run.
    self.assertEqual(rule.chunk_order(MOE_WI[1]), (1, 0, 2, 3))
    self.assertEqual(rule.chunk_order(("exp", "mlp_moe", "layers", "embed_moe")), (3, 0, 1, 2))
    self.assertIsNone(rule.chunk_order(("norm", "layers")))
    self.assertIsNone(chunking.ChunkRule(cut=False).chunk_order(WO[1]))
    tensor_parallel = chunking.ChunkRule(target_mesh=chunking.parse_mesh("fsdp=4,tensor=4"))
    self.assertEqual(tensor_parallel.chunk_order(WO[1]), (0, 2, 1))  # mlp (tensor) and embed (fsdp) first.

  def test_target_mesh_cuts_each_leaf_into_its_shards(self):
    rule = chunking.ChunkRule(target_mesh=chunking.parse_mesh("fsdp=16,tensor=4"))
    # No stage or expert axis: a chunk holds every layer and expert of its shard (the write blocks bound it).
    self.assertEqual(rule.chunk_shape(*WI, BF16), (128, 16, 1536))
    self.assertEqual(rule.chunk_shape(*MOE_WI, BF16), (128, 128, 48, 192))
    expert_parallel = chunking.ChunkRule(target_mesh=chunking.parse_mesh("fsdp=16,expert=8,stage=4"))
    self.assertEqual(expert_parallel.chunk_shape(*MOE_WI, BF16), (16, 128, 12, 768))
    self.assertEqual(rule.record(), {"rule": "target_mesh", "target_mesh": {"fsdp": 16, "tensor": 4},
                                     "devices_per_host": 4})

  def test_host_shape_is_one_restoring_hosts_part(self):
    # fsdp=16 on hosts of 4: each host holds a quarter of `embed`, all of the rest.
    fsdp = chunking.ChunkRule(target_mesh=chunking.parse_mesh("fsdp=16"))
    self.assertEqual(fsdp.host_shape(*WI), (512, 16, 6144))
    self.assertEqual(fsdp.host_shape(*WO), (6144, 16, 512))
    self.assertEqual(fsdp.host_shape(*MOE_WI), (128, 512, 48, 768))
    # Devices in MaxText's order (fsdp outer, tensor inner): a host's four are one fsdp shard's four tensor shards.
    tensor = chunking.ChunkRule(target_mesh=chunking.parse_mesh("fsdp=16,tensor=4"))
    self.assertEqual(tensor.host_shape(*WI), (128, 16, 6144))
    # ... or half of them: the part is cut along `mlp` too.
    wide = chunking.ChunkRule(target_mesh=chunking.parse_mesh("fsdp=4,tensor=8"))
    self.assertEqual(wide.host_shape(*WI), (512, 16, 3072))
    self.assertEqual(chunking.ChunkRule(target_mesh=chunking.parse_mesh("fsdp=16"), devices_per_host=8
                                        ).host_shape(*WI), (1024, 16, 6144))

  def test_no_host_shape_where_hosts_do_not_hold_separate_boxes(self):
    fsdp = chunking.ChunkRule(target_mesh=chunking.parse_mesh("fsdp=16"))
    self.assertIsNone(fsdp.host_shape((2048, 16), ("norm", "layers")))  # Every host holds all of it.
    self.assertIsNone(chunking.ChunkRule(target_mesh=chunking.parse_mesh("fsdp=4")).host_shape(*WI))  # One host.
    self.assertIsNone(chunking.ChunkRule().host_shape(*WI))  # The default rule: no hosts known.
    # Six devices on hosts of four: the first host holds a whole fsdp shard and a third of the next.
    odd = chunking.ChunkRule(target_mesh=chunking.parse_mesh("fsdp=2,tensor=3"))
    self.assertIsNone(odd.host_shape((2048, 16, 6144), ("embed", "layers", "mlp")))


class PredictedAmplificationTest(parameterized.TestCase):

  @parameterized.parameters(
      # target-mesh-notes.md, 4 hosts x 4 devices (fsdp=16): our 1-device layout reads wi_0 on every host...
      (WI, (2048, 1, 4096), 16, 4.0, 16.0),
      # ... and wo (1365-wide blocks) 2.67x; the 16-device layout reads wi_0 once.
      (WO, (6144, 1, 1365), 16, 2.67, 9.33),
      (WI, (128, 1, 4096), 16, 1.0, 1.0),
  )
  def test_measured_layouts(self, leaf, chunk, fsdp, dedup, worst):
    got = amplification(*leaf, chunk, chunking.fsdp_mesh(fsdp))
    self.assertAlmostEqual(got[0], dedup, places=2)
    self.assertAlmostEqual(got[1], worst, places=2)

  @parameterized.parameters(16, 64, 256)
  def test_default_layout_reads_once_on_power_of_two_fsdp_meshes(self, fsdp):
    rule = chunking.ChunkRule()
    for shape, axes in (WI, WO, MOE_WI):
      dedup, _ = amplification(shape, axes, rule.chunk_shape(shape, axes, BF16), chunking.fsdp_mesh(fsdp))
      self.assertAlmostEqual(dedup, 1.0, places=6, msg=(shape, fsdp))

  def test_target_mesh_layout_reads_once_in_the_worst_case(self):
    mesh = chunking.parse_mesh("fsdp=16,tensor=4,expert=2")
    rule = chunking.ChunkRule(target_mesh=mesh)
    for shape, axes in (WI, WO, MOE_WI):
      dedup, worst = amplification(shape, axes, rule.chunk_shape(shape, axes, BF16), mesh)
      self.assertEqual((round(dedup, 6), round(worst, 6)), (1.0, 1.0), shape)


class PredictedRequestsTest(absltest.TestCase):
  """A host's read calls: one per stored chunk its devices' shards touch (counted, not enumerated)."""

  def test_each_chunk_a_host_touches_is_one_read(self):
    mesh = chunking.fsdp_mesh(16)  # 4 hosts x 4 devices; wi's embed axis in 16 shards of 128 rows.
    self.assertEqual(chunking.read_requests(WI[0], (128, 1, 6144), WI[1], mesh), [4 * 16] * 4)  # A layer a chunk.
    self.assertEqual(chunking.read_requests(WI[0], (128, 16, 6144), WI[1], mesh), [4] * 4)  # Its shards exactly.
    self.assertEqual(chunking.read_requests(WI[0], (32, 16, 6144), WI[1], mesh), [16] * 4)  # 4 chunks a shard.
    # Chunks across shards: a host's 4 shards (512 rows) in 2 chunks of 256 rows (the others' are not read).
    self.assertEqual(chunking.read_requests(WI[0], (256, 16, 6144), WI[1], mesh), [2] * 4)
    # Unsharded (the vocab dimension does not divide): every host reads every chunk.
    self.assertEqual(chunking.read_requests((1001, 64), (7, 64), ("norm", None), mesh), [143] * 4)

  def test_the_busiest_host_over_every_leaf_beside_the_pre_sharded_layout(self):
    mesh = chunking.fsdp_mesh(16)
    leaves = [chunking.StoredLeaf(WI[0], (128, 1, 6144), BF16, WI[1]),
              chunking.StoredLeaf(WO[0], (6144, 1, 128), BF16, WO[1])]
    self.assertEqual(chunking.predicted_requests(leaves, mesh), 2 * 4 * 16)
    self.assertEqual(chunking.predicted_requests(chunking.pre_sharded(leaves, mesh), mesh), 2 * 4)
    (line,) = chunking.restore_lines(leaves, [mesh])
    self.assertIn("128 local read calls (16.0x the pre-sharded 8)", line)

  def test_bucket_requests_two_per_stored_block_a_host_touches(self):
    mesh = chunking.fsdp_mesh(16)
    # Blocks of 4 layers across the whole embed axis: every host touches all 4 of them, index + its run each.
    spanning = chunking.StoredLeaf(WI[0], (128, 1, 6144), BF16, WI[1], block=(2048, 4, 6144))
    self.assertEqual(chunking.bucket_requests(spanning, mesh), [2 * 4] * 4)
    # Blocks cut at a host's quarter of the embed axis: each host touches only its own.
    own = chunking.StoredLeaf(WI[0], (128, 1, 6144), BF16, WI[1], block=(512, 16, 6144))
    self.assertEqual(chunking.bucket_requests(own, mesh), [2] * 4)
    # A block that is one chunk is read whole, in one request.
    whole = chunking.StoredLeaf(WI[0], (128, 16, 6144), BF16, WI[1])
    self.assertEqual(chunking.bucket_requests(whole, mesh), [4] * 4)
    self.assertEqual(chunking.predicted_bucket_requests([spanning, own], mesh), 10)
    (line,) = chunking.restore_lines([spanning, own], [mesh])
    self.assertIn("about 10 bucket requests (5.0x the pre-sharded 2)", line)


if __name__ == "__main__":
  absltest.main()
