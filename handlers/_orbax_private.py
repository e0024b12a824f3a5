"""The Orbax internals this package needs, imported in one place.

orbax-checkpoint 0.12.8 exposes no public path to the v1 leaf-handler registry or to the numpy leaf handler:
`ocp.v1.serialization` and `PyTreeOptions.leaf_handler_registry` were removed upstream in May 2026, while
`ocp.v1.handlers.PyTreeHandler(leaf_handler_registry=...)` still takes one. When Orbax publishes these again,
this module is the only file to change.
"""

from orbax.checkpoint.experimental.v1._src.serialization import numpy_leaf_handler as _numpy_leaf_handler
from orbax.checkpoint.experimental.v1._src.serialization import registry as _registry

NumpyLeafHandler = _numpy_leaf_handler.NumpyLeafHandler
NumpyShapeDtype = _numpy_leaf_handler.NumpyShapeDtype
StandardLeafHandlerRegistry = _registry.StandardLeafHandlerRegistry
UnregisteredTypeError = _registry.UnregisteredTypeError
