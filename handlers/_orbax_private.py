"""The Orbax internals this package needs, imported in one place.

orbax-checkpoint 0.12.8 exposes no public path to the v1 leaf-handler registry, to the numpy and array leaf
handlers, or to the pieces a handler needs to write an array itself (the tensorstore write spec, the sharding
file, the commit future), nor an option for the codecs of a stored array: `ocp.v1.serialization` and
`PyTreeOptions.leaf_handler_registry` were removed upstream in May 2026, while
`ocp.v1.handlers.PyTreeHandler(leaf_handler_registry=...)` still takes one. When Orbax publishes these again, this
module is the only file to change.
"""

from typing import Awaitable, Callable

from orbax.checkpoint._src.futures import future as _future
from orbax.checkpoint._src.path import async_path as _async_path
from orbax.checkpoint._src.serialization import jax_array_handlers as _jax_array_handlers
from orbax.checkpoint._src.serialization import ocdbt_utils as _ocdbt_utils
from orbax.checkpoint._src.serialization import tensorstore_utils as _ts_utils
from orbax.checkpoint.experimental.v1._src.serialization import array_leaf_handler as _array_leaf_handler
from orbax.checkpoint.experimental.v1._src.serialization import numpy_leaf_handler as _numpy_leaf_handler
from orbax.checkpoint.experimental.v1._src.serialization import registry as _registry
from orbax.checkpoint.experimental.v1._src.serialization import types as _types

NumpyLeafHandler = _numpy_leaf_handler.NumpyLeafHandler
NumpyShapeDtype = _numpy_leaf_handler.NumpyShapeDtype
ArrayLeafHandler = _array_leaf_handler.ArrayLeafHandler
AbstractShardedArray = _types.AbstractShardedArray
StandardLeafHandlerRegistry = _registry.StandardLeafHandlerRegistry
UnregisteredTypeError = _registry.UnregisteredTypeError

CommitFuture = _future.CommitFutureAwaitingContractedSignals
build_array_write_spec = _ts_utils.build_array_write_spec
default_ts_context = _ts_utils.get_ts_context
process_index_for_subdir = _ocdbt_utils.get_process_index_for_subdir
# Writes the per-leaf `_sharding` entries exactly as Orbax's own ArrayHandler does.
serialize_shardings = _jax_array_handlers._async_serialize_shardings  # pylint: disable=protected-access


def add_to_default_ts_contexts(resources: dict) -> None:
  """Adds tensorstore context resources to the contexts Orbax builds for every save and restore
  (`tensorstore_utils.get_ts_context` offers no parameter for them)."""
  _ts_utils._BASE_TS_CONTEXT.update(resources)  # pylint: disable=protected-access
  _ts_utils._DEFAULT_OCDBT_TS_CONTEXT.update(resources)  # pylint: disable=protected-access


_stock_ocdbt_kvstore_tspec = _ts_utils._build_ocdbt_kvstore_tspec  # pylint: disable=protected-access


def configure_process_btree_nodes(max_decoded_node_bytes: int) -> None:
  """Caps the B-tree nodes of every per-process OCDBT database this process writes from now on (Orbax's 100 MB
  keeps a whole checkpoint's index in one leaf that every commit rewrites).

  Orbax writes each process's arrays into a database of its own (`ocdbt.process_N`) and, once all are written,
  copies their entries into the checkpoint's database in one transaction (`merge_ocdbt_per_process_files`),
  whose nodes keep Orbax's size: readers traverse that one. Readers take a database's configuration from its
  manifest, so stock Orbax and MaxText read either. Orbax builds every OCDBT kvstore spec in one function
  (`tensorstore_utils._build_ocdbt_kvstore_tspec`) with the configuration fixed; it is wrapped, once, for the
  whole process."""

  def build(directory, name=None, *, process_spec=None, write_options=None, **kwargs):
    spec = _stock_ocdbt_kvstore_tspec(directory, name, process_spec=process_spec, write_options=write_options,
                                      **kwargs)
    if process_spec is not None and "config" in spec:
      spec["config"] = {**spec["config"], "max_decoded_node_bytes": max_decoded_node_bytes}
    return spec

  _ts_utils._build_ocdbt_kvstore_tspec = build  # pylint: disable=protected-access


def create_array_metadata_dir(array_metadata_store, checkpoint_dir) -> Awaitable[None]:
  """Creates the directory `array_metadata_store.write` later writes each process's file into (the primary's
  part of its `_maybe_create_base_dir`, which the other processes wait for by polling)."""
  resolver = array_metadata_store._path_resolver  # pylint: disable=protected-access
  return _async_path.mkdir(resolver.get_write_file_path(checkpoint_dir, 0).parent, parents=True, exist_ok=True)


def leaf_handler_registry_of(pytree_handler) -> "StandardLeafHandlerRegistry":
  """The leaf registry an `ocp.v1.handlers.PyTreeHandler` saves and loads with (no public accessor in 0.12.8)."""
  return pytree_handler._leaf_handler_registry  # pylint: disable=protected-access


CRC32C_CODEC = {"name": "crc32c"}
_stock_zarr3_metadata = _ts_utils._build_zarr3_metadata  # pylint: disable=protected-access
_chunk_checksums = True
_zstd_level: int | None = None  # None: Orbax's own.


def _checksummed(codecs: list[dict]) -> list[dict]:
  """A chunk codec chain whose every chunk is checked on read: zstd writing its content checksum (an XXH64 of the
  chunk's bytes in each frame), or, with no compressor, a crc32c codec closing the chain."""
  if any(codec.get("name") == "zstd" for codec in codecs):
    return [{**codec, "configuration": {**codec.get("configuration", {}), "checksum": True}}
            if codec.get("name") == "zstd" else codec for codec in codecs]
  return codecs if codecs[-1:] == [CRC32C_CODEC] else [*codecs, CRC32C_CODEC]


def with_chunk_checksums(metadata: dict) -> dict:
  """zarr3 array `metadata` whose stored chunks each carry a checksum (`_checksummed`, inside the
  `sharding_indexed` codec where there is one).

  Orbax 0.12.8 checksums only the shard index; the chunks themselves are plain zstd frames or raw bytes, so a
  damaged byte mostly restores as a wrong value without an error. tensorstore verifies either checksum on every
  read (any reader of the zarr3 spec, stock Orbax and MaxText included) and refuses a mismatch. zstd's own costs
  less than a crc32c codec after it (measured: docs/troubleshooting.md). It is a property of the codec chain, not
  of the chunk grid: every chunk of every grid carries one."""
  return _with_chunk_codecs(metadata, _checksummed)


def with_zstd_level(metadata: dict, level: int) -> dict:
  """zarr3 array `metadata` whose zstd codec (inside the `sharding_indexed` codec where there is one) compresses
  at `level`."""
  return _with_chunk_codecs(metadata, lambda codecs: [
      {**codec, "configuration": {**codec.get("configuration", {}), "level": level}}
      if codec.get("name") == "zstd" else codec for codec in codecs])


def _with_chunk_codecs(metadata: dict, rewrite: Callable[[list[dict]], list[dict]]) -> dict:
  """zarr3 array `metadata` with the codec chain each stored chunk is encoded with rewritten: the one inside the
  `sharding_indexed` codec where there is one, else the array's own."""
  codecs = metadata.get("codecs") or []
  if codecs and codecs[0].get("name") == "sharding_indexed":
    configuration = codecs[0]["configuration"]
    codecs = [{**codecs[0], "configuration": {**configuration, "codecs": rewrite(configuration["codecs"])}},
              *codecs[1:]]
  else:
    codecs = rewrite(codecs)
  return {**metadata, "codecs": codecs}


def _zarr3_metadata(global_shape, chunk_shape, use_compression: bool) -> dict:
  metadata = _stock_zarr3_metadata(global_shape, chunk_shape, use_compression)
  if _zstd_level is not None:
    metadata = with_zstd_level(metadata, _zstd_level)
  return with_chunk_checksums(metadata) if _chunk_checksums else metadata


def configure_chunks(*, checksums: bool, zstd_level: int | None) -> None:
  """How the arrays this process saves from now on store their chunks: with a checksum on every one
  (`with_chunk_checksums`), compressed at zstd `level` (`with_zstd_level`; None: Orbax's 3).

  Orbax builds every array's zarr3 metadata in one function (`tensorstore_utils._build_zarr3_metadata`, for our
  streamed leaves, its own numpy and jax.Array leaves and scalars alike) and has no option for the codec chain:
  it is replaced by one that sets both, once, for the whole process."""
  global _chunk_checksums, _zstd_level
  _chunk_checksums, _zstd_level = checksums, zstd_level
  _ts_utils._build_zarr3_metadata = _zarr3_metadata  # pylint: disable=protected-access


def with_inner_chunks(json_spec: dict, inner: tuple[int, ...] | None, order: tuple[int, ...] | None = None,
                      element_order: tuple[int, ...] | None = None) -> dict:
  """`json_spec` (from `build_array_write_spec`) with its zarr3 `sharding_indexed` inner chunk set to `inner`:
  Orbax 0.12.8 always makes it the whole write shape (its own TODO b/354139177 suggests this split) and has no
  option for it. With `order`, a `transpose` codec ahead of the sharding codec orders each write block's inner
  chunks with axis `order[0]` outermost; each chunk's elements lie in `element_order` (C order when None), by a
  second `transpose` inside the sharding codec where that differs from what the first leaves. Every zarr3 reader
  undoes both. Specs without that codec (zarr2) are returned as they are."""
  codecs = (json_spec.get("metadata") or {}).get("codecs") or []
  if inner is None or not codecs or codecs[0].get("name") != "sharding_indexed":
    return json_spec
  chunk = [inner[axis] for axis in order] if order else list(inner)
  configuration = {**codecs[0]["configuration"], "chunk_shape": chunk}
  # The elements' order relative to the chunk as the outer transpose leaves it.
  within = [(order or range(len(inner))).index(axis) for axis in element_order or range(len(inner))]
  if within != sorted(within):
    configuration["codecs"] = [{"name": "transpose", "configuration": {"order": within}}, *configuration["codecs"]]
  codecs = [{**codecs[0], "configuration": configuration}, *codecs[1:]]
  if order:
    codecs.insert(0, {"name": "transpose", "configuration": {"order": list(order)}})
  return {**json_spec, "metadata": {**json_spec["metadata"], "codecs": codecs}}

