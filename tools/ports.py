"""A free TCP port on 127.0.0.1, for the local servers tests and benchmarks start (a GCS emulator, JAX's
coordinator)."""

import socket


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]
