"""Orbax handlers for lazily loaded tensors: save them through the v1 API, restore them as numpy anywhere."""

from handlers.lazy_tensor import (
    LazyTensor,
    LazyTensorLoadError,
    RegionLoader,
    ShardedLazyTensor,
    TensorLoader,
    block_indices,
)
from handlers.leaf_handler import (
    DEFAULT_MAX_INFLIGHT_BYTES,
    JAX_ARRAY_TYPESTR,
    NUMPY_TYPESTR,
    LazyTensorLeafHandler,
    ShardedLazyTensorLeafHandler,
    add_lazy_tensor_leaf_handler,
)
from handlers.registry import ITEMS, build_lazy_tensor_checkpointables_registry, lazy_tensor_context
from handlers.tree_handler import LazyTensorPyTreeHandler, unhandled_leaves
from handlers.v0_registration import LazyTensorV0Handler, register_v0_type_handler

register_v0_type_handler()

__all__ = [
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "ITEMS",
    "JAX_ARRAY_TYPESTR",
    "NUMPY_TYPESTR",
    "LazyTensor",
    "LazyTensorLeafHandler",
    "LazyTensorLoadError",
    "LazyTensorPyTreeHandler",
    "LazyTensorV0Handler",
    "RegionLoader",
    "ShardedLazyTensor",
    "ShardedLazyTensorLeafHandler",
    "TensorLoader",
    "add_lazy_tensor_leaf_handler",
    "block_indices",
    "build_lazy_tensor_checkpointables_registry",
    "lazy_tensor_context",
    "register_v0_type_handler",
    "unhandled_leaves",
]
