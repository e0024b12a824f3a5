"""glibc's malloc, set for a process that allocates and frees gigabytes in blocks of megabytes (its write
blocks, transposed slabs, tensorstore's encoded and decoded chunks) on several threads."""

from __future__ import annotations

import ctypes

# glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

# The largest value glibc accepts on 64-bit systems; the write blocks (handlers/blocks.py) and row slabs
# (converter/planning/plan.py) are 16 MiB, so every one of them comes from the heap.
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 1 << 30
# A re-layout reads through TensorStore: its chunk buffers and read pieces (a MiB or less,
# converter/sources/checkpoint_reader.py) come and go between the blocks, and with the blocks in the heap too
# the freed pieces left holes no block fits in, so the heap grew around them (docs/relayout.md: 639-667 MiB
# against 598-607 with the blocks mapped, in the same wall).
RELAYOUT_MMAP_THRESHOLD_BYTES = 4 << 20


def configure(mmap_threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
  """One arena whose freed blocks are reused (those below `mmap_threshold_bytes`); call before any thread
  starts. False where glibc is not the C library (nothing changed).

  - One arena: by default each thread that allocates gets its own, and memory returns to the system only from
    the top of each; with blocks allocated on reader threads and freed on tensorstore's, the arenas fragmented
    and the resident set grew although the bytes alive stayed within the budget.
  - A fixed mmap threshold and a high trim threshold: by default glibc maps any allocation above a threshold
    that moves with what was freed last, and gives the top of the heap back once it exceeds twice that, so
    block after block was a fresh mapping the kernel zeroed page by page, and every unmap held the process's
    memory map lock while the page faults of its other threads waited. Freed blocks now stay in the heap and
    are reused; the peak is unchanged (the budget bounds what is alive), but the memory is kept until exit.
  """
  try:
    mallopt = ctypes.CDLL("libc.so.6").mallopt
  except (OSError, AttributeError):
    return False
  for option, value in ((M_ARENA_MAX, 1), (M_MMAP_THRESHOLD, mmap_threshold_bytes),
                        (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)):
    if not mallopt(option, value):
      return False
  return True
