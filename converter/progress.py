"""A progress bar in bytes written, with throughput, time left and the process's resident memory."""

from __future__ import annotations

import shutil
import sys
import time

import psutil
import tqdm

from handlers.write_options import BlockWritten


class Progress:
  """Counts written blocks into a tqdm bar on stderr; silent when disabled or stderr is not a terminal.

  The bar appears at `start(total_bytes)`, once the plan (and so the total) is known.
  """

  def __init__(self, *, enabled: bool, description: str = "saving"):
    self._enabled = enabled and sys.stderr.isatty()
    self._description = description
    self._process = psutil.Process()
    self._bar: tqdm.tqdm | None = None
    self._last_postfix = 0.0

  def start(self, total_bytes: int) -> None:
    size = shutil.get_terminal_size()  # 80x24 when the terminal reports none (tqdm would hide the bar).
    self._bar = tqdm.tqdm(
        total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc=self._description,
        file=sys.stderr, disable=not self._enabled, smoothing=0.1, ncols=size.columns, nrows=size.lines,
    )

  def __call__(self, event: BlockWritten) -> None:
    self.advance(event.nbytes)

  def advance(self, nbytes: int) -> None:
    if self._bar is None:
      return
    self._bar.update(nbytes)
    now = time.monotonic()
    if now - self._last_postfix >= 0.5:
      self._last_postfix = now
      self._bar.set_postfix_str(f"RSS {self._process.memory_info().rss / 2**30:.2f} GiB", refresh=False)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
