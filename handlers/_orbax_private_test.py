"""The pieces of Orbax's internals this package changes: the inner chunks, and a checksum on every chunk."""

from absl.testing import absltest

from handlers import _orbax_private

_BYTES = {"name": "bytes", "configuration": {"endian": "little"}}
_ZSTD = {"name": "zstd", "configuration": {"level": 3}}
_ZSTD_CHECKED = {"name": "zstd", "configuration": {"level": 3, "checksum": True}}
_CRC32C = {"name": "crc32c"}


def _sharded(inner_codecs: list) -> dict:
  return {"shape": [8, 4], "codecs": [{"name": "sharding_indexed", "configuration": {
      "chunk_shape": [8, 4], "codecs": inner_codecs, "index_codecs": [_BYTES, _CRC32C], "index_location": "end"}}]}


class ChunkChecksumsTest(absltest.TestCase):

  def test_each_chunk_is_checksummed_by_zstd_or_else_a_crc32c(self):
    for inner, checked in (([_BYTES, _ZSTD], [_BYTES, _ZSTD_CHECKED]), ([_BYTES], [_BYTES, _CRC32C])):
      checksummed = _orbax_private.with_chunk_checksums(_sharded(inner))
      self.assertEqual(checksummed["codecs"][0]["configuration"]["codecs"], checked)
      self.assertEqual(checksummed["codecs"][0]["configuration"]["index_codecs"], [_BYTES, _CRC32C])
      self.assertEqual(_orbax_private.with_chunk_checksums(checksummed), checksummed)
    unsharded = {"shape": [8], "codecs": [_BYTES]}
    self.assertEqual(_orbax_private.with_chunk_checksums(unsharded)["codecs"], [_BYTES, _CRC32C])

  def test_orbax_builds_checksummed_metadata_while_enabled(self):
    from orbax.checkpoint._src.serialization import tensorstore_utils  # pylint: disable=g-import-not-at-top

    def inner_codecs(use_compression: bool) -> list:
      metadata, _, _ = tensorstore_utils._build_zarr_shard_and_chunk_metadata(  # pylint: disable=protected-access
          global_shape=(8, 4), shard_shape=(8, 4), use_compression=use_compression, use_zarr3=True,
          chunk_shape=(8, 4))
      return metadata["codecs"][0]["configuration"]["codecs"]

    try:
      _orbax_private.configure_chunks(checksums=True, zstd_level=None)
      self.assertEqual(inner_codecs(True), [_BYTES, _ZSTD_CHECKED])
      self.assertEqual(inner_codecs(False), [_BYTES, _CRC32C])
      _orbax_private.configure_chunks(checksums=False, zstd_level=None)
      self.assertEqual(inner_codecs(True), [_BYTES, _ZSTD])
      _orbax_private.configure_chunks(checksums=True, zstd_level=1)
      leveled = {**_ZSTD_CHECKED, "configuration": {**_ZSTD_CHECKED["configuration"], "level": 1}}
      self.assertEqual(inner_codecs(True), [_BYTES, leveled])
      self.assertEqual(inner_codecs(False), [_BYTES, _CRC32C])  # No compressor, no level.
    finally:
      _orbax_private.configure_chunks(checksums=True, zstd_level=None)

  def test_inner_chunks_keep_the_checksum(self):
    spec = {"driver": "zarr3", "metadata": _orbax_private.with_chunk_checksums(_sharded([_BYTES, _ZSTD]))}
    inner = _orbax_private.with_inner_chunks(spec, (2, 4))
    self.assertEqual(inner["metadata"]["codecs"][0]["configuration"]["chunk_shape"], [2, 4])
    self.assertEqual(inner["metadata"]["codecs"][0]["configuration"]["codecs"], [_BYTES, _ZSTD_CHECKED])


if __name__ == "__main__":
  absltest.main()
