"""A leaf loader that fails whenever it is read: a source going bad mid-conversion, for the output's tests."""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from converter.planning.loader import Loader


@dataclasses.dataclass(frozen=True)
class FailingLoader:
  inner: Loader

  shape = property(lambda self: self.inner.shape)
  dtype = property(lambda self: self.inner.dtype)
  block_shape = property(lambda self: self.inner.block_shape)

  def __call__(self) -> np.ndarray:
    raise OSError("disk went away")

  def region(self, index: tuple[slice, ...]) -> np.ndarray:
    raise OSError("disk went away")

  def source_tensors(self):
    return self.inner.source_tensors()

  def map_reads(self, read: Callable[[Loader], Loader]) -> Loader:
    return FailingLoader(self.inner.map_reads(read))


def failing(plan, leaf_index: int):
  """The same plan (the same fingerprint: names, shapes, sources) with one leaf that cannot be read."""
  leaves = list(plan.leaves)
  leaves[leaf_index] = dataclasses.replace(leaves[leaf_index], loader=FailingLoader(leaves[leaf_index].loader))
  return dataclasses.replace(plan, leaves=tuple(leaves))
