"""A progress bar in bytes written, with throughput, time left and the process's resident memory."""

from __future__ import annotations

import shutil
import sys
import time

import psutil
import tqdm

from handlers import BlockWritten


class Progress:
  """Counts written blocks into a tqdm bar on stderr; silent when disabled or stderr is not a terminal."""

  def __init__(self, total_bytes: int, *, enabled: bool, description: str = "saving"):
    """`total_bytes` may be 0 and set later with `start(total)`, once the plan is known."""
    self._process = psutil.Process()
    self._bar = tqdm.tqdm(
        total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc=description, file=sys.stderr,
        disable=not (enabled and sys.stderr.isatty()), smoothing=0.1,
        ncols=shutil.get_terminal_size().columns or 100,
    )
    self._last_postfix = 0.0
    self.peak_rss = self._process.memory_info().rss

  def start(self, total_bytes: int) -> None:
    self._bar.reset(total=total_bytes)

  def __call__(self, event: BlockWritten) -> None:
    self.advance(event.nbytes)

  def advance(self, nbytes: int) -> None:
    self._bar.update(nbytes)
    now = time.monotonic()
    if now - self._last_postfix >= 0.5:
      self._last_postfix = now
      rss = self._process.memory_info().rss
      self.peak_rss = max(self.peak_rss, rss)
      self._bar.set_postfix_str(f"RSS {rss / 2**30:.2f} GiB", refresh=False)

  def close(self) -> None:
    self._bar.close()
