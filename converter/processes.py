"""Several processes converting one checkpoint: joining JAX's distributed runtime, who this process is, the
barriers between the steps that only the primary process takes (preparing the output, committing), and the
claims through which they share out the work.

Each process then writes a disjoint share of the blocks (handlers/shares.py), then what the slower ones have not
started of theirs (handlers/claims.py), into its own OCDBT database, and Orbax's own multi-process protocol has
the primary merge them and commit once every process has finished.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import sys
import threading
import time
from typing import Callable, Iterator

from converter.errors import ConversionError
from handlers.shares import Processes

# A process that dies stops sending heartbeats; the coordinator then fails every other process's next barrier.
HEARTBEAT_TIMEOUT_S = 20
BARRIER_TIMEOUT_S = 3600  # Between two barriers a share is written: up to an hour of work on a pod host.
COORDINATOR_WAIT_S = 300  # As long as jax.distributed.initialize's own default wait for the other processes.
COORDINATOR_POLL_S = 0.01


def join(*, auto: bool, coordinator_address: str | None, num_processes: int, process_id: int) -> None:
  """jax.distributed.initialize with CPU collectives over gloo; `auto` lets JAX discover everything (TPU pods,
  SLURM)."""
  import jax  # pylint: disable=g-import-not-at-top

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if auto:
    jax.distributed.initialize(heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
    return
  if not coordinator_address:
    raise ConversionError("--num_processes > 1 needs --coordinator_address (process 0's HOST:PORT)")
  if process_id >= num_processes:
    raise ConversionError(f"--process_id={process_id} is not below --num_processes={num_processes}")
  if process_id != 0:
    wait_for_coordinator(coordinator_address)
  jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                             process_id=process_id, heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)


def wait_for_coordinator(address: str, timeout_s: float = COORDINATOR_WAIT_S) -> bool:
  """Waits until process 0's coordinator accepts connections at HOST:PORT (or `timeout_s` passes; initialize
  then reports what it finds). A process whose first connection is refused, because process 0 is still
  importing, waits out gRPC's reconnect backoff instead: about a second of every process's start-up, idle
  (docs/several-hosts.md). Returns whether it answered."""
  host, _, port = address.rpartition(":")
  if not port.isdigit():
    return False  # Not HOST:PORT; initialize says so in its own words.
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
      return True
    except OSError:
      if time.monotonic() >= deadline:
        return False
      time.sleep(COORDINATOR_POLL_S)


GLOO_PREFIX = b"[Gloo] "


@contextlib.contextmanager
def gloo_lines_dropped() -> Iterator[None]:
  """Standard output without Gloo's connection lines while the block runs.

  Gloo (JAX's CPU collectives across processes) prints "[Gloo] Rank N is connected to 1 peer ranks ..." to
  standard output from C++, once per local device when Orbax's save first runs a collective: nothing a user can
  act on, and it lands among the summary lines scripts read. File descriptor 1 goes through a pipe meanwhile, and
  every other line passes through unchanged.
  """
  sys.stdout.flush()
  original = os.dup(1)
  read_end, write_end = os.pipe()
  os.dup2(write_end, 1)
  os.close(write_end)

  def forward() -> None:
    with os.fdopen(read_end, "rb") as lines:
      for line in lines:
        if not line.startswith(GLOO_PREFIX):
          os.write(original, line)

  forwarder = threading.Thread(target=forward, name="gloo-lines-dropped", daemon=True)
  forwarder.start()
  try:
    yield
  finally:
    sys.stdout.flush()
    os.dup2(original, 1)  # Closes the pipe's last write end: the forwarder reads to its end and stops.
    forwarder.join()
    os.close(original)


def current() -> Processes:
  import jax  # pylint: disable=g-import-not-at-top

  return Processes(index=jax.process_index(), count=jax.process_count(), primary=0)


_SAVES = itertools.count()  # Every process saves the same sequence of checkpoints.


class CoordinatorClaims:
  """`handlers.claims.Claims` kept in the key-value store of JAX's distributed runtime (held by the coordinator,
  process 0): a key written only where it is absent is a claim, its value the process that won it."""

  def __init__(self, index: int):
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

    self._client = ocp.multihost.get_jax_distributed_client()
    self._index = index
    self._prefix = f"hf2maxtext/claims/{next(_SAVES)}"

  def claim(self, share: str, owner: int, unit: int) -> int:
    import jax  # pylint: disable=g-import-not-at-top

    key = f"{self._prefix}/{share}/{owner}/{unit}"
    try:
      self._client.key_value_set(key, str(self._index))
      return self._index
    except jax.errors.JaxRuntimeError as e:
      if "ALREADY_EXISTS" not in str(e):
        raise ConversionError(f"claiming a share of the work from the coordinator failed: {e}") from e
    return int(self._client.key_value_try_get(key))


_FAILED = "\0failed: "


def primary_value(name: str, compute: Callable[[], str], index: int, timeout_s: float = BARRIER_TIMEOUT_S) -> str:
  """`compute()` as the primary process (`index` 0) computes it, for every process: what must not differ between
  them (a Hub revision's commit, which a commit landing between two processes' requests would change). A failure
  of the primary's is every process's."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  key = f"hf2maxtext/primary/{name}"
  client = ocp.multihost.get_jax_distributed_client()
  if index == 0:
    try:
      value = compute()
    except ConversionError as e:
      client.key_value_set(key, _FAILED + str(e))  # The others fail with the same line instead of waiting.
      raise
    client.key_value_set(key, value)
    return value
  value = client.blocking_key_value_get(key, int(timeout_s * 1000))
  if value.startswith(_FAILED):
    raise ConversionError(value.removeprefix(_FAILED))
  return value


def claims(processes: Processes) -> CoordinatorClaims | None:
  """The claims several processes share out their work through; None for one process."""
  return CoordinatorClaims(processes.index) if processes.count > 1 else None


def barrier(name: str, processes: Processes) -> None:
  """Every process waits here until all have arrived (a no-op for one process)."""
  if processes.count == 1:
    return
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  ocp.multihost.sync_global_processes(f"hf2maxtext:{name}", timeout=BARRIER_TIMEOUT_S)
