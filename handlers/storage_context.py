"""Tensorstore settings every Orbax save and restore in this process uses, whatever the storage."""

from __future__ import annotations

from typing import Any

from handlers import _orbax_private


def add_tensorstore_resources(resources: dict[str, Any]) -> None:
  """Adds context resources (e.g. `gcs_request_retries`, so that a storage outage fails a save in bounded time
  instead of tensorstore's default of about 15 minutes of retries) to every context Orbax opens arrays with."""
  _orbax_private.add_to_default_ts_contexts(resources)
