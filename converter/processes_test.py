"""What of the multi-process set-up is checkable in one process: flags refused before JAX's runtime is joined,
the arguments it is joined with, who this process is, barriers that cost nothing alone, and claims made through
a real coordination service by two clients."""

import itertools
import os
import socket
import sys
import threading
import time
from unittest import mock

import jax

jax.config.update("jax_platforms", "cpu")

import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top,g-bad-import-order
from absl.testing import absltest, parameterized

from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top  (the runtime's service and clients, unjoined)

from converter import processes  # pylint: disable=g-import-not-at-top
from converter.errors import ConversionError
from handlers import Processes, claims
from tools.ports import free_port


class JoinTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    # Never joins for real: initialize would wait for a coordinator that does not exist.
    self.initialize = self.enter_context(mock.patch.object(jax.distributed, "initialize", autospec=True))
    self.wait = self.enter_context(mock.patch.object(processes, "wait_for_coordinator", autospec=True))

  @parameterized.named_parameters(
      ("no_coordinator", dict(coordinator_address=None, num_processes=2, process_id=0),
       r"needs --coordinator_address"),
      ("empty_coordinator", dict(coordinator_address="", num_processes=2, process_id=1),
       r"needs --coordinator_address"),
      ("id_equal_to_count", dict(coordinator_address="host:1234", num_processes=2, process_id=2),
       r"--process_id=2 is not below --num_processes=2"),
      ("id_above_count", dict(coordinator_address="host:1234", num_processes=4, process_id=9),
       r"--process_id=9 is not below --num_processes=4"),
  )
  def test_bad_flags_are_refused_before_joining(self, flags, message):
    with self.assertRaisesRegex(ConversionError, message):
      processes.join(auto=False, **flags)
    self.initialize.assert_not_called()

  def test_explicit_join_passes_the_flags_and_a_heartbeat_timeout(self):
    processes.join(auto=False, coordinator_address="host:1234", num_processes=4, process_id=3)
    self.initialize.assert_called_once_with(coordinator_address="host:1234", num_processes=4, process_id=3,
                                            heartbeat_timeout_seconds=processes.HEARTBEAT_TIMEOUT_S)
    self.assertEqual(jax.config.jax_cpu_collectives_implementation, "gloo")  # CPU collectives between hosts.
    self.wait.assert_called_once_with("host:1234")

  def test_process_zero_starts_the_coordinator_without_waiting_for_it(self):
    processes.join(auto=False, coordinator_address="host:1234", num_processes=4, process_id=0)
    self.wait.assert_not_called()
    self.initialize.assert_called_once()

  def test_auto_join_lets_jax_discover_everything(self):
    # With auto, the coordinator flags are not needed (TPU pods, SLURM) and not checked.
    processes.join(auto=True, coordinator_address=None, num_processes=1, process_id=5)
    self.initialize.assert_called_once_with(heartbeat_timeout_seconds=processes.HEARTBEAT_TIMEOUT_S)


class WaitForCoordinatorTest(absltest.TestCase):

  def test_returns_once_the_coordinator_listens(self):
    port = free_port()
    listener = socket.socket()
    timer = threading.Timer(0.3, lambda: (listener.bind(("127.0.0.1", port)), listener.listen()))
    timer.start()
    try:
      started = time.monotonic()
      self.assertTrue(processes.wait_for_coordinator(f"127.0.0.1:{port}", timeout_s=30))
      self.assertLess(time.monotonic() - started, 5)  # Polls: no reconnect backoff of a second or more.
    finally:
      timer.join()
      listener.close()

  def test_gives_up_after_the_timeout_when_nobody_listens(self):
    self.assertFalse(processes.wait_for_coordinator(f"127.0.0.1:{free_port()}", timeout_s=0.2))

  def test_an_address_without_a_port_is_left_to_initialize(self):
    self.assertFalse(processes.wait_for_coordinator("host-without-port", timeout_s=30))


class CurrentAndBarrierTest(absltest.TestCase):

  def test_current_is_the_only_process_when_none_was_joined(self):
    self.assertEqual(processes.current(), Processes(index=0, count=1, primary=0))
    self.assertTrue(processes.current().is_primary)

  def test_a_barrier_of_one_process_does_not_synchronise(self):
    with mock.patch.object(ocp.multihost, "sync_global_processes", autospec=True) as sync:
      processes.barrier("prepared", Processes())
    sync.assert_not_called()

  def test_a_barrier_of_several_processes_waits_under_a_named_key(self):
    with mock.patch.object(ocp.multihost, "sync_global_processes", autospec=True) as sync:
      processes.barrier("prepared", Processes(index=1, count=2))
    sync.assert_called_once_with("hf2maxtext:prepared", timeout=processes.BARRIER_TIMEOUT_S)



class CoordinatorClaimsTest(absltest.TestCase):
  """Two processes' claims through one coordination service, as jax.distributed.initialize would connect them."""

  def setUp(self):
    super().setUp()
    address = f"127.0.0.1:{free_port()}"
    service = _jax.get_distributed_runtime_service(address, 2)
    self.addCleanup(service.shutdown)
    self.clients = [_jax.get_distributed_runtime_client(address, i, shutdown_on_destruction=False) for i in (0, 1)]
    self._in_parallel([client.connect for client in self.clients])  # Each waits for the other.
    self.addCleanup(self._in_parallel, [client.shutdown for client in self.clients])

  def _in_parallel(self, functions) -> None:
    threads = [threading.Thread(target=f) for f in functions]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join(timeout=60)

  def _claims(self, index: int) -> processes.CoordinatorClaims:
    # Each process counts its own saves from 0.
    with mock.patch.object(ocp.multihost, "get_jax_distributed_client", return_value=self.clients[index]), \
         mock.patch.object(processes, "_SAVES", itertools.count()):
      return processes.claims(Processes(index=index, count=2))

  def test_the_first_claim_wins_and_the_others_learn_who_holds_it(self):
    first, second = self._claims(0), self._claims(1)
    self.assertEqual(first.claim("params.x", 0, 0), 0)
    self.assertEqual(second.claim("params.x", 0, 0), 0)
    self.assertEqual(second.claim("params.x", 0, 1), 1)
    self.assertEqual(first.claim("params.x", 0, 1), 1)
    self.assertEqual(second.claim("params.y", 0, 0), 1)  # Another share, claimed afresh.

  def test_two_processes_write_every_block_once(self):
    sizes = [(5 + i % 7) << 20 for i in range(300)]
    written: list[list[int]] = [[], []]

    def write(index: int, holder: processes.CoordinatorClaims) -> None:
      for number in claims.claimed_blocks(sizes, Processes(index=index, count=2), holder, "params.x"):
        written[index].append(number)
        time.sleep(0.001 * (1 + 4 * index))  # Process 1 is five times slower.

    holders = [self._claims(0), self._claims(1)]
    self._in_parallel([lambda: write(0, holders[0]), lambda: write(1, holders[1])])
    self.assertCountEqual(written[0] + written[1], range(len(sizes)))
    self.assertGreater(sum(sizes[n] for n in written[0]), 0.6 * sum(sizes))  # It took over process 1's end.

  def test_every_process_takes_the_primarys_value_or_its_failure(self):
    answers, asked = [None, None], []

    def value(index: int, name: str, compute) -> None:
      with mock.patch.object(ocp.multihost, "get_jax_distributed_client", return_value=self.clients[index]):
        try:
          answers[index] = processes.primary_value(name, compute, index, timeout_s=30)
        except ConversionError as e:
          answers[index] = e

    def commit() -> str:
      asked.append(1)
      return "c" * 40

    self._in_parallel([lambda: value(1, "hub/o/n@main", lambda: "never asked"),
                       lambda: value(0, "hub/o/n@main", commit)])
    self.assertEqual((answers, asked), (["c" * 40, "c" * 40], [1]))

    def refused() -> str:
      raise ConversionError("o/n (revision main): repository not found")

    self._in_parallel([lambda: value(1, "hub/o/absent@main", commit), lambda: value(0, "hub/o/absent@main", refused)])
    self.assertEqual([str(a) for a in answers], ["o/n (revision main): repository not found"] * 2)
    self.assertEqual(asked, [1])

  def test_one_process_makes_no_claims(self):
    self.assertIsNone(processes.claims(Processes()))


class GlooLinesDroppedTest(absltest.TestCase):

  def test_gloo_lines_are_dropped_and_everything_else_passes_in_order(self):
    captured = os.path.join(absltest.get_default_test_tmpdir(), "stdout.txt")
    sys.stdout.flush()
    saved = os.dup(1)
    with open(captured, "wb") as f:
      os.dup2(f.fileno(), 1)
    try:
      with processes.gloo_lines_dropped():
        os.write(1, b"[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1\n")
        print("family:        qwen3")
        sys.stdout.flush()
        os.write(1, b"native line\n[Gloo] Rank 0 is connected to 1 peer ranks.\n")
      print("after")
      sys.stdout.flush()
    finally:
      os.dup2(saved, 1)
      os.close(saved)
    with open(captured, "rb") as f:
      self.assertEqual(f.read(), b"family:        qwen3\nnative line\nafter\n")

if __name__ == "__main__":
  absltest.main()
