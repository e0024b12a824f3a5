"""Synthetic Qwen3-MoE checkpoints shared by the integration tests, defined once.

The bucket, Hub, interruption, one-writer and multi-process tests each need a random MoE checkpoint of a given
shape; they used to spell the same configs out one by one. The shapes here are the ones those tests were written
against, and what makes each one fit its test is said next to it.
"""

from __future__ import annotations

from typing import Any

from integration_tests import harness
from tools import synthetic_checkpoint

# A few MB over 2 layers of 8 experts: quick to convert, upload and download, and still an MoE tree.
SMALL_MOE: dict[str, int] = dict(hidden=256, layers=2, experts=8, moe_dim=128, heads=4, kv_heads=2, head_dim=64,
                                 vocab=1000)
# About 100 MB in 64-expert layers: 0.8 MiB natural blocks, so a 2 MiB budget (STREAMING_BUDGET) makes dozens of
# durable writes, and a conversion is still writing when a test interrupts it, stops its server or starts a second
# writer.
STREAMED_MOE: dict[str, int] = dict(hidden=512, layers=4, experts=64, moe_dim=256, heads=8, kv_heads=2, head_dim=64,
                                    vocab=4096)
# The --max_inflight_bytes the STREAMED_MOE tests convert with: 2 MiB.
STREAMING_BUDGET = "--max_inflight_bytes=2097152"


def moe_config(shape: dict[str, int], **changes: int) -> dict[str, Any]:
  """The config.json of a synthetic Qwen3-MoE model of `shape` (SMALL_MOE, STREAMED_MOE), `changes` applied."""
  return synthetic_checkpoint.qwen3_moe_config(**{**shape, **changes})


def write_moe(prefix: str, shape: dict[str, int], *, max_shard_bytes: int | None = None, **changes: int) -> str:
  """Writes a random bfloat16 Qwen3-MoE checkpoint of `shape` (with `changes`) into a new scratch directory named
  `prefix`...; returns the directory. `max_shard_bytes` splits it into several safetensors files."""
  config = moe_config(shape, **changes)
  directory = harness.scratch_dir(prefix)
  kwargs = {} if max_shard_bytes is None else {"max_shard_bytes": max_shard_bytes}
  synthetic_checkpoint.write_checkpoint(directory, config, list(synthetic_checkpoint.qwen3_moe_shapes(config)),
                                        **kwargs)
  return directory
