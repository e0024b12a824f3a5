"""The one interface every leaf loader implements: how a plan's leaf is computed, block by block.

A plan (converter/planning/plan.py) gives every output leaf a loader; nothing is read until the writer, `--verify` or a
resumed run calls it. Loaders are small frozen records (source tensors, ops, shapes) so that a whole plan pickles
across process boundaries. The implementations: converter/planning/loaders.py (a source tensor, a stack of parts, parts
joined into slots), converter/planning/native_fp8.py (block scales), converter/output/resume.py (blocks salvaged from an
interrupted run).
"""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

import numpy as np

from converter.arrays import Shape
from converter.sources import SourceTensor


@runtime_checkable
class Loader(Protocol):
  """A leaf's value, whole or one region at a time."""

  @property
  def shape(self) -> Shape:
    ...

  @property
  def dtype(self) -> np.dtype:
    ...

  @property
  def block_shape(self) -> Shape:
    """The largest region this loader computes without computing more than it returns (a slab of rows of a large
    tensor, one layer of a stack); the writer cuts its blocks to divide it."""

  def __call__(self) -> np.ndarray:
    """The whole value."""

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    """One region (a step-1 slice on every axis), reading only the source bytes it needs."""

  def source_tensors(self) -> tuple[SourceTensor, ...]:
    """Every source tensor it reads, in order (errors name them; a resumed run fingerprints their files)."""

  def map_reads(self, read: Callable[[Loader], Loader]) -> Loader:
    """This loader with each of its single-tensor reads replaced by `read(that read)` (--keep_fp8 reads FP8
    weights as their stored bytes); a composite takes its dtype from its rewritten parts."""
