"""Chooses an output's kind of storage from its path, apart from destination.py so that the protocol the kinds
implement (local.py and bucket.py import it) does not import them back."""

from __future__ import annotations

from converter import storage
from converter.output.bucket import Bucket
from converter.output.destination import Destination
from converter.output.hub_repo import HubRepo
from converter.output.local import LocalDisk
from converter.storage.hub import is_hub


def destination_for(path: str, *, hub_private: bool = False) -> Destination:
  """The destination of a resolved output path: a Hub repo for hf:// (created `hub_private` when missing), a
  bucket for gs:// and s3:// paths, else a local disk."""
  if is_hub(path):
    return HubRepo(path, private=hub_private)
  return Bucket(path) if storage.is_remote(path) else LocalDisk(path)
