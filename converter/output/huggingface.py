"""The output of a conversion back to HuggingFace: OUTPUT_DIR as a safetensors checkpoint directory, whole or not
at all.

Everything is written into a staging directory beside the output and renamed into place at the end (a local
disk), or into the prefix itself with config.json written last (a bucket, where config.json is what makes it a
checkpoint), so a failed conversion leaves nothing that looks finished. With several processes the primary stages
and publishes; every process writes its shards into the same staging directory in between.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Mapping

from converter import processes as processes_lib
from converter import storage
from converter.errors import ConversionError
from converter.options import RunContext
from converter.output import lock
from converter.output.destinations import destination_for
from converter.output.primary import all_then_on_primary, on_primary_then_all


class HuggingFaceOutput:
  """OUTPUT_DIR of a conversion to HuggingFace, on a local disk or in a bucket."""

  def __init__(self, output_dir: str, run: RunContext, *, hub_private: bool = False):
    self.path = output_dir
    self._run = run
    self._destination = destination_for(output_dir, hub_private=hub_private)

  def write(self, write_shards: Callable[[str, Callable[[str], None]], None],
            last_files: Callable[[], Mapping[str, str | bytes]]) -> None:
    """`write_shards(directory, finished)` writes this process's shards there, calling `finished(path)` as each
    is complete (a Hub repo sends it then); once every process has, the primary writes
    `last_files()` (name -> text or bytes: the index and config.json, which make it a checkpoint, and the
    original's tokenizer and serving files) and publishes."""
    processes = self._run.processes
    with lock.hold(self._destination) if processes.is_primary else contextlib.nullcontext():
      staging = on_primary_then_all(
          processes, "output prepared",
          lambda: self._destination.stage(self._run.overwrite, shared=processes.count > 1))
      if staging is None:
        staging = self._destination.shared_staging()
      try:
        write_shards(staging, self._destination.finished_file)
        all_then_on_primary(processes, "shards written", lambda: self._publish(staging, last_files()))
      except OSError as e:
        self._discard(staging)
        raise ConversionError(f"{self.path}: writing the HF checkpoint failed: {e}") from e
      except BaseException:
        self._discard(staging)
        raise
      processes_lib.barrier("published", processes)

  def _publish(self, staging: str, files: Mapping[str, str | bytes]) -> None:
    for name, data in files.items():
      storage.write_bytes(storage.join(staging, name), data if isinstance(data, bytes) else data.encode("utf-8"))
    self._destination.publish(staging, unsynced=tuple(files))

  def _discard(self, staging: str) -> None:
    if self._run.processes.is_primary:
      self._destination.discard(staging)
