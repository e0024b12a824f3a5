"""The bug, kept visible: a v1 save of LazyTensor leaves without our registry fails, and the v0 entry doesn't help.

If a future Orbax starts consulting the v0 registry (or names the leaf), this test fails and tells us the
workaround can be revisited.
"""

from __future__ import annotations

import functools
import os

from absl.testing import absltest

from integration_tests import harness

harness.start_jax()

import numpy as np  # pylint: disable=g-import-not-at-top,g-bad-import-order
import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

import handlers  # pylint: disable=g-import-not-at-top  (registers the v0 type handler on import)


def _ones(shape):
  return np.ones(shape, np.float32)


def _lazy_tree():
  return {"step": 0, "params": {"params": {"w": handlers.LazyTensor("w", (4, 4), np.float32, functools.partial(_ones, (4, 4)))}},
          "opt_state": {}}


class OrbaxV1RegressionTest(absltest.TestCase):

  def test_v0_registration_is_present(self):
    # The reference converter's only registration: present here too, and still not enough for v1.
    self.assertIsInstance(
        ocp.type_handlers.get_type_handler(handlers.LazyTensor), handlers.LazyTensorV0Handler
    )

  def test_v1_save_without_registry_fails_naming_only_the_checkpointable(self):
    out = harness.scratch_dir("regression-")
    checkpointer = ocp.v1.training.Checkpointer(out)
    with self.assertRaises(KeyError) as ctx:  # Orbax's NoEntryError, a KeyError with no public import path.
      checkpointer.save_checkpointables(0, {"items": _lazy_tree()})
    checkpointer.close()
    self.assertEqual(type(ctx.exception).__name__, "NoEntryError")
    self.assertIn('"items"', str(ctx.exception))
    self.assertNotIn("LazyTensor", str(ctx.exception))  # Why the reference converter's users were lost.
    self.assertFalse(os.path.exists(os.path.join(out, "0", "commit_success.txt")))

  def test_same_save_with_registry_succeeds(self):
    out = harness.scratch_dir("regression-")
    checkpointer = ocp.v1.training.Checkpointer(out, context=handlers.lazy_tensor_context())
    checkpointer.save_checkpointables(0, {"items": _lazy_tree()})
    checkpointer.close()
    restored = ocp.PyTreeCheckpointer().restore(os.path.join(out, "0", "items"))
    np.testing.assert_array_equal(restored["params"]["params"]["w"], np.ones((4, 4), np.float32))


if __name__ == "__main__":
  absltest.main()
