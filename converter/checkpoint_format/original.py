"""Where the original HuggingFace model of a conversion lives, as the conversion record keeps it (`hf_source`): the
way back copies its serving files from there."""

from __future__ import annotations

import dataclasses
import re

from converter import storage
from converter.storage import hub

# A Hub repo's snapshot in the local HF cache (huggingface_hub's layout): where a repo id's config.json was read.
_HUB_SNAPSHOT = re.compile(r".*/models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<commit>[0-9a-f]{40})/?$")


@dataclasses.dataclass(frozen=True)
class Original:
  """Where the original model lives: a directory, a bucket prefix, or a Hub repo id at `revision`."""

  location: str
  revision: str | None = None  # A Hub repo id's branch, tag or commit; None for a path.

  @property
  def on_hub(self) -> bool:
    return self.revision is not None

  def describe(self) -> str:
    return f"{self.location} (revision {self.revision})" if self.on_hub else self.location

  def record(self) -> dict[str, str | None]:
    return {"location": self.location, "revision": self.revision}

  @classmethod
  def of_directory(cls, directory: str) -> Original:
    """The model a directory holds: a Hub repo at its commit when it is one (`hf://ORG/NAME@COMMIT`) or a snapshot
    of the local HF cache (which holds only what the conversion fetched), else the directory itself."""
    if hub.is_hub(directory):  # Read from the Hub at one commit (converter/storage/hub.py).
      file = hub.parse(directory)
      return cls(file.repo_id, file.revision)
    match = _HUB_SNAPSHOT.match(directory)
    if match:
      return cls(f"{match['org']}/{match['name']}", match["commit"])
    return cls(directory)

  @classmethod
  def of_record(cls, entry: object) -> Original | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("location"), str):
      return None
    return cls(entry["location"], entry.get("revision"))
