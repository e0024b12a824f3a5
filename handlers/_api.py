"""Everything `handlers` exports, loaded (with Orbax, JAX and the v0 registration) on the first name asked of it."""

from handlers.lazy_tensor import (
    LazyTensor,
    LazyTensorLoadError,
    LazyTensorWriteError,
    RegionLoader,
    ShardedLazyTensor,
    TensorLoader,
    block_indices,
    brief_error,
)
from handlers.leaf_handler import (
    JAX_ARRAY_TYPESTR,
    NUMPY_TYPESTR,
    LazyTensorLeafHandler,
    ShardedLazyTensorLeafHandler,
    add_lazy_tensor_leaf_handler,
)
from handlers import shares
from handlers.shares import Processes
from handlers.registry import ITEMS, build_lazy_tensor_checkpointables_registry, lazy_tensor_context
from handlers.storage_context import configure_saves
from handlers.tree_handler import LazyTensorPyTreeHandler, unhandled_leaves
from handlers.v0_registration import LazyTensorV0Handler, register_v0_type_handler
from handlers.write_options import DEFAULT_MAX_INFLIGHT_BYTES, BlockWritten, SaveCancelled, WriteOptions

register_v0_type_handler()

__all__ = [
    "configure_saves",
    "shares",
    "BlockWritten",
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "ITEMS",
    "JAX_ARRAY_TYPESTR",
    "NUMPY_TYPESTR",
    "LazyTensor",
    "LazyTensorLeafHandler",
    "LazyTensorLoadError",
    "LazyTensorWriteError",
    "Processes",
    "LazyTensorPyTreeHandler",
    "LazyTensorV0Handler",
    "RegionLoader",
    "SaveCancelled",
    "ShardedLazyTensor",
    "ShardedLazyTensorLeafHandler",
    "TensorLoader",
    "WriteOptions",
    "add_lazy_tensor_leaf_handler",
    "block_indices",
    "brief_error",
    "build_lazy_tensor_checkpointables_registry",
    "lazy_tensor_context",
    "register_v0_type_handler",
    "unhandled_leaves",
]
