"""A command run with its process tree's resident memory sampled: the benchmarks' measure of a conversion's peak.

`wait4`'s ru_maxrss would be simpler, but on Linux a child's starts from its forking parent's resident size, so a
benchmark that has itself grown reports its own size for every child it starts.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time

import psutil


def tree_rss(process: psutil.Process) -> int:
  """The resident bytes of `process` and all its descendants now."""
  total = 0
  for p in [process, *process.children(recursive=True)]:
    try:
      total += p.memory_info().rss
    except psutil.Error:
      pass
  return total


def run_sampled(command: list[str], env: dict[str, str], trace: list[tuple[float, int]] | None = None,
                ) -> tuple[float, int, subprocess.CompletedProcess]:
  """Runs `command`; returns wall seconds, the peak RSS of its process tree (sampled every 20 ms), result.
  `trace`, when given, receives each sample as (seconds since the start, bytes).

  Dirty pages of the previous step are written back first (os.sync), so that no step pays for the writeback of
  the one before it (a reverse conversion started right after the forward one took 5.4 s instead of 3.4 s).
  """
  os.sync()
  start = time.monotonic()
  child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  peak = 0
  done = threading.Event()

  def sample():
    nonlocal peak
    process = psutil.Process(child.pid)
    while not done.is_set():
      try:
        rss = tree_rss(process)
      except psutil.Error:
        break
      peak = max(peak, rss)
      if trace is not None:
        trace.append((time.monotonic() - start, rss))
      time.sleep(0.02)

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  stdout, stderr = child.communicate()
  wall = time.monotonic() - start
  done.set()
  sampler.join()
  return wall, peak, subprocess.CompletedProcess(command, child.returncode, stdout, stderr)
