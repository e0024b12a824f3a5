"""The pieces of Orbax's internals this package changes: the inner chunks, and a checksum on every chunk."""

from absl.testing import absltest

from handlers import _orbax_private

_BYTES = {"name": "bytes", "configuration": {"endian": "little"}}
_ZSTD = {"name": "zstd", "configuration": {"level": 3}}
_CRC32C = {"name": "crc32c"}


def _sharded(inner_codecs: list) -> dict:
  return {"shape": [8, 4], "codecs": [{"name": "sharding_indexed", "configuration": {
      "chunk_shape": [8, 4], "codecs": inner_codecs, "index_codecs": [_BYTES, _CRC32C], "index_location": "end"}}]}


class ChunkChecksumsTest(absltest.TestCase):

  def test_the_checksum_closes_each_chunks_codec_chain_once(self):
    for inner in ([_BYTES, _ZSTD], [_BYTES]):
      checksummed = _orbax_private.with_chunk_checksums(_sharded(inner))
      self.assertEqual(checksummed["codecs"][0]["configuration"]["codecs"], [*inner, _CRC32C])
      self.assertEqual(checksummed["codecs"][0]["configuration"]["index_codecs"], [_BYTES, _CRC32C])
      self.assertEqual(_orbax_private.with_chunk_checksums(checksummed), checksummed)
    unsharded = {"shape": [8], "codecs": [_BYTES, _ZSTD]}
    self.assertEqual(_orbax_private.with_chunk_checksums(unsharded)["codecs"], [_BYTES, _ZSTD, _CRC32C])

  def test_orbax_builds_checksummed_metadata_while_enabled(self):
    from orbax.checkpoint._src.serialization import tensorstore_utils  # pylint: disable=g-import-not-at-top

    def inner_codecs(use_compression: bool) -> list:
      metadata, _, _ = tensorstore_utils._build_zarr_shard_and_chunk_metadata(  # pylint: disable=protected-access
          global_shape=(8, 4), shard_shape=(8, 4), use_compression=use_compression, use_zarr3=True,
          chunk_shape=(8, 4))
      return [codec["name"] for codec in metadata["codecs"][0]["configuration"]["codecs"]]

    try:
      _orbax_private.checksum_chunks(True)
      self.assertEqual(inner_codecs(True), ["bytes", "zstd", "crc32c"])
      self.assertEqual(inner_codecs(False), ["bytes", "crc32c"])
      _orbax_private.checksum_chunks(False)
      self.assertEqual(inner_codecs(True), ["bytes", "zstd"])
    finally:
      _orbax_private.checksum_chunks(True)

  def test_inner_chunks_keep_the_checksum(self):
    spec = {"driver": "zarr3", "metadata": _orbax_private.with_chunk_checksums(_sharded([_BYTES, _ZSTD]))}
    inner = _orbax_private.with_inner_chunks(spec, (2, 4))
    self.assertEqual(inner["metadata"]["codecs"][0]["configuration"]["chunk_shape"], [2, 4])
    self.assertEqual(inner["metadata"]["codecs"][0]["configuration"]["codecs"], [_BYTES, _ZSTD, _CRC32C])


if __name__ == "__main__":
  absltest.main()
