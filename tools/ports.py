"""A free TCP port on 127.0.0.1, for the local servers tests and benchmarks start (a GCS emulator, JAX's
coordinator)."""

import random
import socket


def _bindable(port: int) -> bool:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    try:
      s.bind(("127.0.0.1", port))
    except OSError:
      return False
    return True


def free_port(low: int | None = None, high: int | None = None) -> int:
  """Any free port, or one in [low, high] (where a launcher derives the port, as JAX's SLURM detection does)."""
  if low is None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
      s.bind(("127.0.0.1", 0))
      return s.getsockname()[1]
  candidates = list(range(low, high + 1))
  random.shuffle(candidates)
  for port in candidates:
    if _bindable(port):
      return port
  raise OSError(f"no free port in [{low}, {high}]")
