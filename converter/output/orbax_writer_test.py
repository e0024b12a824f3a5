"""The Orbax save alone: the plan's values stored as they are computed, and failures reported naming the output
and the leaf (with its sources) in one line."""

import os
import signal
import tempfile
import threading

import numpy as np
from absl.testing import absltest

from converter import conversion
from converter.planning import lazy_leaves
from converter.errors import ConversionError
from converter.options import PlanOptions, SaveOptions
from converter.output import orbax_writer
from converter.output.destinations import destination_for
from tools import checkpoint_io
from tools.testing.failing_loader import failing


class OrbaxWriterTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.plan = conversion.plan_conversion("testdata/tiny-qwen3", PlanOptions(save_dtype="float32"))

  def _destination(self):
    return destination_for(os.path.join(tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir()), "out"))

  def test_the_stored_values_are_the_loaders(self):
    destination = self._destination()
    items = orbax_writer.save(self.plan, destination, SaveOptions(devices=1), custom_metadata={"scan_layers": True})
    self.assertEqual(items, os.path.join(destination.path, "0", "items"))
    stored = checkpoint_io.restore_v0(items)["params"]["params"]
    for leaf in self.plan.leaves:
      node = stored
      for key in leaf.path:
        node = node[key]
      np.testing.assert_array_equal(np.asarray(node), leaf.loader(), err_msg=leaf.name)

  def test_a_leaf_that_fails_is_named_with_its_sources(self):
    leaf = self.plan.leaves[2]
    broken = failing(self.plan, 2)
    destination = self._destination()
    with self.assertRaises(ConversionError) as raised:
      orbax_writer.save(broken, destination, SaveOptions(devices=1), custom_metadata={})
    message = str(raised.exception)
    self.assertTrue(message.startswith(f"{destination.path}: "), message)
    self.assertIn(f"{leaf.name} (from {leaf.sources[0]})", message)
    self.assertIn("OSError: disk went away", message)

  def test_a_cancelled_save_says_interrupted(self):
    cancel = threading.Event()
    cancel.set()
    destination = self._destination()
    with self.assertRaisesRegex(ConversionError, f"^{destination.path}: interrupted$"):
      orbax_writer.save(self.plan, destination, SaveOptions(devices=1), custom_metadata={}, cancel=cancel)
    self.assertFalse(destination.has_committed_step())

  def test_a_save_cancelled_while_its_last_blocks_are_in_flight_commits_nothing(self):
    options = SaveOptions(devices=1)
    *_, sizes = lazy_leaves.write_blocks(self.plan, options.max_inflight_bytes)
    written = []
    cancel = threading.Event()

    def block_written(block):
      written.append(block)
      if len(written) == len(sizes):  # Every block has been started: only a check after the last one sees this.
        cancel.set()

    destination = self._destination()
    with self.assertRaisesRegex(ConversionError, f"^{destination.path}: interrupted$"):
      orbax_writer.save(self.plan, destination, options, custom_metadata={}, cancel=cancel,
                        on_block_written=block_written)
    self.assertLen(written, len(sizes))
    self.assertFalse(destination.has_committed_step())

  def test_a_signal_on_a_save_thread_cancels_the_save(self):
    """The kernel may deliver a process's SIGINT to any thread; Python runs the handler on the main thread alone,
    once it next runs bytecode. A main thread blocked in one wait for the whole save ran it after the commit."""
    cancel = threading.Event()
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: cancel.set())
    self.addCleanup(signal.signal, signal.SIGUSR1, previous)

    signalled = []

    def block_written(block):
      del block
      if not signalled and threading.current_thread() is not threading.main_thread():
        signalled.append(threading.get_ident())
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
        cancel.wait(10)  # The save waits for the main thread to run the handler.

    destination = self._destination()
    with self.assertRaisesRegex(ConversionError, f"^{destination.path}: interrupted$"):
      orbax_writer.save(self.plan, destination, SaveOptions(devices=1), custom_metadata={}, cancel=cancel,
                        on_block_written=block_written)
    self.assertFalse(destination.has_committed_step())
    self.assertLen(signalled, 1)


class _Response:
  """An Orbax save response whose save ends after `seconds`, returning or raising `error`."""

  def __init__(self, seconds: float, error: BaseException | None = None):
    self._done = threading.Timer(seconds, lambda: None)
    self._done.start()
    self._error = error
    self.raised = 0

  def result(self, timeout: float | None = None) -> bool:
    self._done.join(timeout)
    if self._done.is_alive():
      raise TimeoutError()  # The poll's own timeout: the save goes on.
    if self._error is not None:
      self.raised += 1
      raise self._error
    return True


class WaitForSignalsTest(absltest.TestCase):

  def test_a_save_that_ends_well_returns(self):
    orbax_writer._wait_for_signals(_Response(0.3))  # pylint: disable=protected-access

  def test_a_save_that_failed_with_a_timeout_is_raised_once(self):
    # Orbax fails a save that outlives its own timeout with TimeoutError; the wait took it for its poll's and
    # asked again forever, the same error's traceback growing at every raise.
    response, raised = _Response(0.3, TimeoutError("Overall save timeout exceeded.")), []

    def wait() -> None:
      try:
        orbax_writer._wait_for_signals(response)  # pylint: disable=protected-access
      except TimeoutError as e:
        raised.append(e)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(10)
    self.assertFalse(waiter.is_alive(), "still waiting on a save that has failed")
    self.assertEqual([str(e) for e in raised], ["Overall save timeout exceeded."])
    self.assertEqual(response.raised, 1)

  def test_the_save_is_not_limited_to_orbax_default_twenty_minutes(self):
    from handlers import registry  # pylint: disable=g-import-not-at-top

    self.assertGreaterEqual(registry.lazy_tensor_context().asynchronous.timeout_secs, 7 * 24 * 3600)


if __name__ == "__main__":
  absltest.main()
