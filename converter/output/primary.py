"""The steps of a multi-process conversion that only the primary process takes (preparing the output, publishing
or cleaning up after the commit), each fenced by a barrier so that no process runs ahead of them."""

from __future__ import annotations

from typing import Callable, TypeVar

from converter import processes as processes_lib
from handlers.shares import Processes

T = TypeVar("T")


def on_primary_then_all(processes: Processes, step: str, action: Callable[[], T]) -> T | None:
  """Runs `action` on the primary process; every process returns once it is done (the others get None)."""
  result = action() if processes.is_primary else None
  processes_lib.barrier(step, processes)
  return result


def all_then_on_primary(processes: Processes, step: str, action: Callable[[], None]) -> None:
  """Runs `action` on the primary process once every process has reached this step."""
  processes_lib.barrier(step, processes)
  if processes.is_primary:
    action()
