"""`--hf_model_path=ORG/NAME` (and `--lora_adapter_path=ORG/NAME`): a Hugging Face Hub repo id, resolved to a
directory of the local HF cache.

Only what a conversion reads is fetched: config.json, the safetensors index when there is one, and the shards it
names (or model.safetensors); for an adapter, adapter_config.json and adapter_model.safetensors; never tokenizers,
other formats or the rest of the repo. Files already in the cache are used as they are (no request at all);
`HF_HUB_OFFLINE=1` uses nothing else; `HF_TOKEN` and `HF_HUB_CACHE` are huggingface_hub's own.
"""

from __future__ import annotations

import os
import re

from converter.errors import ConversionError
from converter import json_input
from converter.sources.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from converter.sources.safetensors import index_weight_map

_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def looks_like_repo_id(value: str, local_path: str) -> bool:
  """ORG/NAME whose local reading (`local_path`) does not exist: a local directory of that name wins."""
  return bool(_REPO_ID.fullmatch(value)) and not os.path.exists(local_path)


def _fetch(repo_id: str, filename: str, revision: str) -> str | None:
  """The cached file's path, downloading it only when it is not cached; None when the repo has no such file."""
  import huggingface_hub  # pylint: disable=g-import-not-at-top
  from huggingface_hub import errors, hf_hub_download  # pylint: disable=g-import-not-at-top

  where = f"{repo_id} (revision {revision})"
  cached = huggingface_hub.try_to_load_from_cache(repo_id, filename, revision=revision)
  if isinstance(cached, str):
    return cached
  if cached is huggingface_hub._CACHED_NO_EXIST:  # pylint: disable=protected-access
    return None  # The cache records that the repo has no such file at this revision.
  if huggingface_hub.constants.HF_HUB_OFFLINE:
    if filename == INDEX:
      return None  # Not cached: a single-file checkpoint, or model.safetensors is missing too.
    raise ConversionError(f"{where}: {filename} is not in the local HF cache ({huggingface_hub.constants.HF_HUB_CACHE})"
                          " and HF_HUB_OFFLINE is set")
  try:
    return hf_hub_download(repo_id, filename, revision=revision)
  except errors.EntryNotFoundError:
    return None
  except errors.GatedRepoError as e:
    raise ConversionError(f"{where}: gated repo; accept its terms on the Hub and set HF_TOKEN ({e})") from e
  except errors.RepositoryNotFoundError as e:
    raise ConversionError(f"{where}: repository not found on the Hub (or private: set HF_TOKEN)") from e
  except errors.RevisionNotFoundError as e:
    raise ConversionError(f"{where}: revision {revision!r} not found") from e
  except (errors.HfHubHTTPError, OSError) as e:
    raise ConversionError(f"{where}: downloading {filename} failed: {type(e).__name__}: {e}") from e


def resolve_config_path(repo_id: str, revision: str = "main") -> str:
  """The snapshot directory holding `repo_id`'s config.json at `revision`, and nothing else fetched."""
  config = _fetch(repo_id, "config.json", revision)
  if config is None:
    raise ConversionError(f"{repo_id} (revision {revision}): the repo has no config.json")
  return os.path.dirname(config)


def resolve_model_path(repo_id: str, revision: str = "main") -> str:
  """The snapshot directory holding `repo_id`'s config.json and safetensors at `revision`."""
  config = os.path.join(resolve_config_path(repo_id, revision), "config.json")
  index = _fetch(repo_id, INDEX, revision)
  if index is not None:
    where = f"{repo_id} (revision {revision}): {INDEX}"
    shards = sorted(set(index_weight_map(json_input.read(index, "unreadable safetensors index"), where).values()))
  else:
    shards = [SINGLE]
  for shard in shards:
    if _fetch(repo_id, shard, revision) is None:
      raise ConversionError(f"{repo_id} (revision {revision}): {shard} is not in the repo"
                            f"{' (named by ' + INDEX + ')' if index else ' (no ' + INDEX + ' either)'}")
  return os.path.dirname(config)


def resolve_adapter_path(repo_id: str, revision: str = "main") -> str:
  """The snapshot directory holding `repo_id`'s PEFT adapter (adapter_config.json, adapter_model.safetensors)."""
  paths = []
  for filename in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
    path = _fetch(repo_id, filename, revision)
    if path is None:
      raise ConversionError(f"{repo_id} (revision {revision}): the repo has no {filename} (not a PEFT adapter saved"
                            " with safetensors)")
    paths.append(path)
  return os.path.dirname(paths[0])
