"""A checkpoint saved through our handlers restores silently where our `handlers` package does not exist.

A training job (MaxText, or any code on stock Orbax) has none of our classes. Orbax resolves the handler of a
checkpointable from the typestr the save recorded in the step's `_CHECKPOINT_METADATA` (`item_handlers`); a
typestr naming one of our classes makes every stock v1 load log "No handler found for typestr ..." and "Failed
to resolve handler ...", although the data itself is stored exactly as a stock save stores it. So these tests
restore in a fresh interpreter that cannot import `handlers`, and fail on any Orbax warning about a handler.
"""

import base64
import functools
import json
import os
import subprocess
import sys
import tempfile

import jax

jax.config.update("jax_platforms", "cpu")

import ml_dtypes  # pylint: disable=g-import-not-at-top,g-bad-import-order
import numpy as np  # pylint: disable=g-import-not-at-top
import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
from absl.testing import absltest  # pylint: disable=g-import-not-at-top

from handlers import (  # pylint: disable=g-import-not-at-top
    ITEMS, LazyTensor, ShardedLazyTensor, WriteOptions, lazy_tensor_context,
)

# Runs in the fresh interpreter: reads OUT/0's metadata and restores it with stock Orbax through the v1 and v0
# APIs (MaxText 0.2.5 uses both), recording every Python warning and every log record at WARNING or above
# (absl logs through `logging`).
_STOCK_RESTORE = r"""
import base64, importlib.util, json, logging, os, sys, warnings

out, result_dir = sys.argv[1], sys.argv[2]
assert importlib.util.find_spec("handlers") is None, "the handlers package is importable here"

records = []


class _Capture(logging.Handler):

  def emit(self, record):
    records.append(f"log {record.name} {record.levelname}: {record.getMessage()}")


logging.getLogger().addHandler(_Capture(level=logging.WARNING))
warnings.simplefilter("always")
warnings.showwarning = lambda message, category, *_, **__: records.append(f"{category.__name__}: {message}")

import jax
jax.config.update("jax_platforms", "cpu")
import numpy as np
import orbax.checkpoint as ocp

step = os.path.join(out, "0")
# MaxText 0.2.5 reads custom_metadata (scan_layers) this way before every load.
scan_layers = ocp.v1.checkpointables_metadata(step).custom_metadata["scan_layers"]
restored = {
    "v1_load_checkpointables": ocp.v1.load_checkpointables(step)[%(items)r],
    "v1_load": ocp.v1.load(step, checkpointable_name=%(items)r),
    "v0_pytree_checkpointer": ocp.PyTreeCheckpointer().restore(os.path.join(step, %(items)r)),
}
manager = ocp.CheckpointManager(out, item_names=(%(items)r,))
restored["v0_checkpoint_manager"] = manager.restore(
    0, args=ocp.args.Composite(**{%(items)r: ocp.args.PyTreeRestore()}))[%(items)r]
manager.close()
leaves = {api: {name: {"dtype": str(np.asarray(leaf).dtype), "shape": list(np.shape(leaf)),
                       "bytes": base64.b64encode(np.asarray(leaf).tobytes()).decode()}
                for name, leaf in tree["params"].items()}
          for api, tree in restored.items()}
with open(os.path.join(result_dir, "result.json"), "w") as f:
  json.dump({"records": records, "leaves": leaves, "scan_layers": scan_layers}, f)
""" % {"items": ITEMS}


def _values(seed, shape):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _single_device_sharding():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("devices",))
  return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def _lazy_tree():
  """A LazyTensor (stored as "np.ndarray") and a ShardedLazyTensor (stored as "jax.Array"), bf16 included."""
  return {"params": {
      "a": LazyTensor("a", (16, 8), ml_dtypes.bfloat16, functools.partial(_values, 0, (16, 8))),
      "b": ShardedLazyTensor("b", (4, 6), np.float32, functools.partial(_values, 1, (4, 6)),
                             _single_device_sharding()),
  }}


def _expected():
  return {"a": np.asarray(_lazy_tree()["params"]["a"]), "b": np.asarray(_lazy_tree()["params"]["b"])}


def _stock_tree():
  """The same arrays as plain numpy / jax.Array leaves, as a stock Orbax save receives them."""
  expected = _expected()
  return {"params": {"a": expected["a"], "b": jax.device_put(expected["b"], _single_device_sharding())}}


def _save(out, tree, context=None):
  checkpointer = ocp.v1.training.Checkpointer(out, context=context)
  checkpointer.save_checkpointables(0, {ITEMS: tree}, custom_metadata={"scan_layers": True})
  checkpointer.close()


def _tmpdir():
  return tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))


class StockRestoreTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.out = os.path.join(_tmpdir(), "ours")
    _save(cls.out, _lazy_tree(), context=lazy_tensor_context(WriteOptions()))

  def test_stock_orbax_restores_without_handlers_package_and_without_handler_warnings(self):
    result_dir = _tmpdir()
    # No PYTHONPATH, -I (no script or working directory on sys.path) and a working directory outside the
    # repository: the interpreter sees only its own site-packages, as a training job does.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "-I", "-c", _STOCK_RESTORE, self.out, result_dir],
        cwd=result_dir, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    self.assertEqual(proc.returncode, 0, proc.stderr[-4000:])
    with open(os.path.join(result_dir, "result.json")) as f:
      result = json.load(f)
    records = result["records"]
    self.assertIs(result["scan_layers"], True)
    about_handlers = [r for r in records if any(w in r.lower() for w in ("handler", "lazytensor", "typestr"))]
    self.assertEmpty(about_handlers, "stock Orbax warned about the handler:\n" + "\n".join(records))
    self.assertCountEqual(
        result["leaves"], ["v1_load_checkpointables", "v1_load", "v0_pytree_checkpointer", "v0_checkpoint_manager"])
    for api, leaves in result["leaves"].items():
      self.assertCountEqual(leaves, _expected(), api)
      for name, expected in _expected().items():
        restored = leaves[name]
        self.assertEqual(restored["dtype"], str(expected.dtype), f"{api} {name}")
        self.assertEqual(tuple(restored["shape"]), expected.shape, f"{api} {name}")
        self.assertEqual(base64.b64decode(restored["bytes"]), expected.tobytes(), f"{api} {name}")

  def test_metadata_is_what_a_stock_save_of_the_same_arrays_writes(self):
    stock = os.path.join(_tmpdir(), "stock")
    _save(stock, _stock_tree())

    def read(root, *path):
      with open(os.path.join(root, "0", *path)) as f:
        return json.load(f)

    self.assertEqual(read(self.out, "_CHECKPOINT_METADATA")["item_handlers"],
                     read(stock, "_CHECKPOINT_METADATA")["item_handlers"])
    self.assertEqual(read(self.out, ITEMS, "_METADATA"), read(stock, ITEMS, "_METADATA"))


if __name__ == "__main__":
  absltest.main()
