"""The Hugging Face Hub, as an input and as an output: the one place for its paths, its client settings (endpoint,
token, retries) and its errors in the user's words.

An input file is `hf://ORG/NAME@COMMIT/FILE`: a repo id's revision is resolved once to its commit
(`resolve_commit`) and every read names that commit, so a commit landing on the branch during a run is never mixed
into it. A file complete in the local HF cache is read from there; the small files a conversion parses (configs,
the index) are fetched into the cache whole, as huggingface_hub does; the weights are read by HTTP range requests
(`read_into`), straight from the storage host the Hub redirects a file to, several parts of one read in flight
at once, so nothing of them reaches the disk. `HF_HUB_OFFLINE=1` reads the cache only; `download_first` (the
converter's --hub_download_first) fetches every file whole into the cache before reading it, as before ranged reads.

`HF_TOKEN`, `HF_ENDPOINT` and `HF_HUB_CACHE` are huggingface_hub's own; its metadata request resolves a file (the
commit, the size, the redirect), and a request that fails with 429, 5xx or a dropped connection is retried with
the storage layer's bounded backoff and counted (`stats`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import re
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from absl import logging
import numpy as np

from converter.errors import ConversionError

SCHEME = "hf://"
_PATH = re.compile(r"hf://(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[^/\s]+))?(?:/(?P<file>.*))?")
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_WEIGHTS = re.compile(r".*\.safetensors")  # Read by ranges; every other file is small and fetched whole.
# Resident besides the blocks while the weights stream in (the connections, their threads' heaps), fitted to
# tools/hub_benchmark.py's peaks against a local conversion's (docs/buckets-and-hub.md): what --dry_run adds.
READ_OVERHEAD_BYTES = 32 << 20
_RETRIED_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_EXPIRED_STATUS = frozenset({401, 403, 404, 410})  # From a storage host: its signed URL expired; resolve again.


@dataclasses.dataclass
class Settings:
  """How the Hub is read: set once by the binary (`configure`)."""

  download_first: bool = False  # Every file fetched whole into the HF cache before it is read.
  connections: int = 16  # Requests in flight at once, over every read.
  part_bytes: int = 8 << 20  # A read larger than this is fetched in parts of this size, in parallel.
  max_retries: int = 10  # The buckets' policy: storage.set_request_retries sets both.
  initial_delay_s: float = 1.0
  max_delay_s: float = 32.0


@dataclasses.dataclass
class Stats:
  """What the Hub's weights cost this process: reported at the end of a conversion."""

  requests: int = 0  # Ranged GETs answered (retries included).
  bytes: int = 0  # Body bytes received.
  retries: int = 0
  resolves: int = 0  # Metadata requests (one per file read by ranges).
  reasons: dict[str, int] = dataclasses.field(default_factory=dict)  # Why requests were retried.

  def describe(self) -> str:
    why = ", ".join(f"{n} x {reason}" for reason, n in sorted(self.reasons.items()))
    return (f"{self.requests:,} ranged requests, {self.bytes:,} bytes, {self.resolves} files resolved,"
            f" {self.retries} retried{f' ({why})' if why else ''}")


_settings = Settings()
_stats = Stats()
_lock = threading.Lock()


def configure(**changes: Any) -> None:
  """Changes the settings; the connections are opened again with them at the next read."""
  global _settings, _pool
  with _lock:
    _settings = dataclasses.replace(_settings, **changes)
    if _pool is not None:
      _pool.shutdown(wait=True)
    for manager in _http.values():
      manager.clear()
    _pool = None
    _http.clear()


def stats() -> Stats:
  return _stats


# Paths ------------------------------------------------------------------------------------------------------------


def is_hub(path: str) -> bool:
  return path.startswith(SCHEME)


@dataclasses.dataclass(frozen=True)
class HubPath:
  repo_id: str
  revision: str | None  # None: the default branch.
  filename: str  # "" for the repo itself.

  @property
  def where(self) -> str:
    """The repo at its revision, as errors name it."""
    return f"{self.repo_id} (revision {self.revision or 'main'})"


def parse(path: str) -> HubPath:
  match = _PATH.fullmatch(path)
  if not match:
    raise ConversionError(f"{path}: expected hf://ORG/NAME, hf://ORG/NAME@REVISION or hf://ORG/NAME@REVISION/FILE")
  return HubPath(match["repo"], match["revision"], (match["file"] or "").strip("/"))


def path_of(repo_id: str, revision: str, filename: str = "") -> str:
  return f"{SCHEME}{repo_id}@{revision}" + (f"/{filename}" if filename else "")


# Errors -----------------------------------------------------------------------------------------------------------


def _first_line(e: BaseException) -> str:
  text = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
  return f"{type(e).__name__}: {text}" if text else type(e).__name__


def error(where: str, e: BaseException, doing: str, *, writing: bool = False) -> ConversionError:
  """huggingface_hub's (or the HTTP client's) error in the user's words, on one line."""
  from huggingface_hub import errors  # pylint: disable=g-import-not-at-top

  response = getattr(e, "response", None)
  status = getattr(response, "status_code", None)
  message = (getattr(response, "headers", None) or {}).get("X-Error-Message", "")
  if isinstance(e, errors.GatedRepoError):
    why = "gated repo; accept its terms on the Hub and set HF_TOKEN to a token of an account that did"
  elif status == 401 and "credentials" in message.lower():
    why = ("the Hub refused the token (set HF_TOKEN to a valid token" + (" with write access" if writing else "")
           + ", or run `hf auth login`)")
  elif isinstance(e, errors.RepositoryNotFoundError):
    why = "repository not found on the Hub (or private: set HF_TOKEN)"
  elif isinstance(e, errors.RevisionNotFoundError):
    why = "revision not found"
  elif status == 403:
    why = ("this token may not write to the repo (a read-only token, or another user's repo)" if writing
           else "this token may not read the repo (HTTP 403)")
  elif status == 412:
    why = ("another commit landed on the branch while this conversion ran; nothing was committed: run it again"
           " (the shards already uploaded are not sent twice)")
  elif isinstance(e, errors.OfflineModeIsEnabled):
    why = "not in the local HF cache and HF_HUB_OFFLINE is set"
  else:
    why = _first_line(e)
  return ConversionError(f"{where}: {doing} failed: {why}")


def api():
  """huggingface_hub's client with its own endpoint and token (HF_ENDPOINT, HF_TOKEN); progress bars off, since a
  conversion reports its own progress."""
  from huggingface_hub import HfApi, utils  # pylint: disable=g-import-not-at-top

  utils.disable_progress_bars()
  return HfApi()


# Resolving a revision ---------------------------------------------------------------------------------------------


def _huggingface_hub():
  """The package, with the submodules used here loaded (its attributes load lazily, not these)."""
  import huggingface_hub  # pylint: disable=g-import-not-at-top
  import huggingface_hub.constants  # pylint: disable=g-import-not-at-top,unused-import
  import huggingface_hub.errors  # pylint: disable=g-import-not-at-top,unused-import
  import huggingface_hub.utils  # pylint: disable=g-import-not-at-top,unused-import

  return huggingface_hub


def _offline() -> bool:
  return _huggingface_hub().constants.HF_HUB_OFFLINE


def resolve_commit(repo_id: str, revision: str, first_file: str) -> str:
  """The commit `revision` (a branch, tag or commit) of `repo_id` is at, from `first_file` (the file a conversion
  reads first: config.json, adapter_config.json): the local cache's when it holds that file at that revision (no
  request at all), else the Hub's answer. Raises, naming the repo and revision, when neither knows it."""
  hub = _huggingface_hub()
  where = HubPath(repo_id, revision, "").where
  cached = hub.try_to_load_from_cache(repo_id, first_file, revision=revision)
  if isinstance(cached, str):
    return _snapshot_commit(cached)
  if _offline():
    raise ConversionError(f"{where}: {first_file} is not in the local HF cache ({hub.constants.HF_HUB_CACHE}) and"
                          " HF_HUB_OFFLINE is set")
  try:
    metadata = hub.get_hf_file_metadata(hub.hf_hub_url(repo_id, first_file, revision=revision),
                                        retry_on_errors=True)
  except hub.errors.RevisionNotFoundError as e:
    raise ConversionError(f"{where}: revision {revision!r} not found") from e
  except hub.errors.EntryNotFoundError as e:
    raise ConversionError(f"{where}: the repo has no {first_file}") from e
  except Exception as e:  # pylint: disable=broad-except  # huggingface_hub's (and its client's), said in one line.
    raise error(where, e, f"reading {first_file}") from e
  if not metadata.commit_hash:
    raise ConversionError(f"{where}: the Hub named no commit for {first_file} (X-Repo-Commit missing)")
  return metadata.commit_hash


def looks_like_repo_id(value: str, local_path: str) -> bool:
  """ORG/NAME whose local reading (`local_path`) does not exist: a local directory of that name wins."""
  return bool(REPO_ID.fullmatch(value)) and not os.path.exists(local_path)


def repo_directory(value: str, revision: str, first_file: str) -> str:
  """`hf://ORG/NAME@COMMIT` of a repo id (or `hf://ORG/NAME[@REVISION]`; its own revision wins over `revision`):
  the directory every file of the conversion is read from, pinned to one commit."""
  if is_hub(value):
    named = parse(value)
    value, revision = named.repo_id, named.revision or revision
  return path_of(value, resolve_commit(value, revision, first_file))


def _snapshot_commit(cached_file: str) -> str:
  """The commit of a file in the cache's layout: .../snapshots/COMMIT/FILE."""
  parts = cached_file.replace("\\", "/").split("/")
  return parts[parts.index("snapshots") + 1]


# One file ---------------------------------------------------------------------------------------------------------


_MISSING = object()  # The repo has no such file at that commit.


def _read_by_ranges(filename: str) -> bool:
  """Whether a file not in the cache is read by ranges (weights, online, not --hub_download_first) rather than
  fetched whole or, offline, not at all."""
  return bool(_WEIGHTS.fullmatch(filename)) and not _settings.download_first and not _offline()


@functools.cache
def local_copy(path: str) -> str | None:
  """The local file holding `path`'s bytes: complete in the HF cache already, or fetched whole into it now (a
  file that is not weights, every file with `download_first`, every file offline); None when its weights are to be
  read by ranges, or when the repo has no such file (`exists` tells them apart)."""
  hub = _huggingface_hub()
  file = parse(path)
  cached = hub.try_to_load_from_cache(file.repo_id, file.filename, revision=file.revision)
  if isinstance(cached, str):
    return cached
  if cached is hub._CACHED_NO_EXIST:  # pylint: disable=protected-access  (the cache's own record of no such file)
    return None
  if _offline():
    if _WEIGHTS.fullmatch(file.filename):
      raise ConversionError(f"{path}: not in the local HF cache ({hub.constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE"
                            " is set")
    return None
  if _read_by_ranges(file.filename):
    return None
  try:
    return hub.hf_hub_download(file.repo_id, file.filename, revision=file.revision)
  except hub.errors.EntryNotFoundError:
    return None
  except Exception as e:  # pylint: disable=broad-except
    raise error(path, e, "downloading") from e


_metadatas: dict[str, Any] = {}


def _metadata(path: str, refresh: bool = False):
  """huggingface_hub's metadata of a file read by ranges (size, commit, the storage URL it redirects to), or
  _MISSING; asked once per file, and again with `refresh` (the storage URL expired)."""
  with _lock:
    known = _metadatas.get(path)
  if known is not None and not refresh:
    return known
  hub = _huggingface_hub()
  file = parse(path)
  with _lock:
    _stats.resolves += 1
  try:
    metadata = hub.get_hf_file_metadata(hub.hf_hub_url(file.repo_id, file.filename, revision=file.revision),
                                        retry_on_errors=True)
  except hub.errors.EntryNotFoundError:
    with _lock:
      _metadatas[path] = _MISSING
    return _MISSING
  except Exception as e:  # pylint: disable=broad-except
    raise error(path, e, "resolving") from e
  if metadata.size is None:
    raise ConversionError(f"{path}: the Hub gave no size for it (X-Linked-Size and Content-Length missing)")
  if metadata.commit_hash and file.revision and metadata.commit_hash != file.revision:
    raise ConversionError(f"{path}: the Hub answered with commit {metadata.commit_hash}, not the one pinned")
  with _lock:
    _metadatas[path] = metadata
  return metadata


def exists(path: str) -> bool:
  """Whether the repo holds `path` at its commit (the repo itself, for a path naming no file)."""
  file = parse(path)
  if not file.filename:
    return True
  if local_copy(path) is not None:
    return True
  return _read_by_ranges(file.filename) and _metadata(path) is not _MISSING


def size(path: str) -> int:
  local = local_copy(path)
  if local is not None:
    return os.path.getsize(local)
  metadata = _metadata(path) if _read_by_ranges(parse(path).filename) else _MISSING
  if metadata is _MISSING:
    raise FileNotFoundError(f"{parse(path).where}: the repo has no {parse(path).filename}")
  return metadata.size


def version(path: str) -> str:
  """What names this file's content: its commit and ETag (the commit alone for a cached file)."""
  local = local_copy(path)
  return parse(path).revision if local is not None else f"{parse(path).revision}:{_metadata(path).etag}"


# Ranged reads -----------------------------------------------------------------------------------------------------

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_http: dict[str | None, Any] = {}  # urllib3's pool managers, by the proxy they go through (None: none).


def _parts_pool() -> concurrent.futures.ThreadPoolExecutor:
  global _pool
  with _lock:
    if _pool is None:
      _pool = concurrent.futures.ThreadPoolExecutor(_settings.connections, thread_name_prefix="hf2maxtext-hub")
    return _pool


def _http_for(location: str):
  """urllib3's connections to `location`'s host (through HTTPS_PROXY or HTTP_PROXY unless NO_PROXY names it):
  its responses read straight into the caller's buffer (`readinto`), a fraction of the CPU a pure-Python HTTP
  parser spends per byte (docs/buckets-and-hub.md)."""
  import urllib.request  # pylint: disable=g-import-not-at-top
  import urllib3  # pylint: disable=g-import-not-at-top

  parts = urlsplit(location)
  proxy = None if urllib.request.proxy_bypass(parts.hostname or "") else urllib.request.getproxies().get(parts.scheme)
  with _lock:
    manager = _http.get(proxy)
    if manager is None:
      options = dict(num_pools=8, maxsize=_settings.connections, retries=False,
                     timeout=urllib3.Timeout(connect=30.0, read=60.0), ca_certs=_ca_certs())
      manager = urllib3.ProxyManager(proxy, **options) if proxy else urllib3.PoolManager(**options)
      _http[proxy] = manager
    return manager


def _ca_certs() -> str | None:
  """certifi's bundle where it is installed (it is, with huggingface_hub), as huggingface_hub's own client uses."""
  try:
    import certifi  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return certifi.where()


def _location(path: str, refresh: bool = False) -> str:
  """Where `path`'s bytes are served: the storage host the Hub redirects it to (a signed URL), or the Hub."""
  metadata = _metadata(path, refresh)
  if metadata is _MISSING:
    raise FileNotFoundError(f"{parse(path).where}: the repo has no {parse(path).filename}")
  return metadata.location


def _on_storage_host(location: str) -> bool:
  return urlsplit(location).netloc != urlsplit(_huggingface_hub().constants.ENDPOINT).netloc


def _headers(location: str) -> dict[str, str]:
  """The Hub's own headers (the token among them) for a request to the Hub's endpoint; none for its storage host,
  which takes the signed URL alone and must never see the token."""
  if _on_storage_host(location):
    return {"Accept-Encoding": "identity"}
  return {**_huggingface_hub().utils.build_hf_headers(), "Accept-Encoding": "identity"}


class HubReadError(OSError):
  """A ranged read that failed for good (its retries spent, or refused): the caller names the tensor."""


def _retry_delay(attempt: int, retry_after: str | None) -> float:
  delay = min(_settings.max_delay_s, _settings.initial_delay_s * 2 ** attempt)
  if retry_after and retry_after.strip().isdigit():
    delay = min(_settings.max_delay_s, max(delay, float(retry_after)))
  return delay


def _fetch(path: str, start: int, into: memoryview) -> None:
  """Bytes [start, start + len(into)) of `path` into `into`: one ranged GET, retried; a connection dropped midway
  is resumed from the first byte it did not deliver."""
  import urllib3  # pylint: disable=g-import-not-at-top

  stop = start + len(into)
  refreshed = False
  attempt = 0
  while True:
    location = _location(path)
    why = None
    retry_after = None
    received = 0
    response = None
    try:
      response = _http_for(location).request(
          "GET", location, headers={**_headers(location), "Range": f"bytes={start}-{stop - 1}"},
          preload_content=False, decode_content=False, redirect=False)
      with _lock:
        _stats.requests += 1
      status = response.status
      if status == 206 or (status == 200 and start == 0 and stop == size(path)):
        while received < len(into):
          count = response.readinto(into[received:])
          if not count:
            break
          received += count
        if received == len(into):
          return
        why = f"connection lost after {received:,} of {len(into):,} bytes"
      elif status in _RETRIED_STATUS:
        why = f"HTTP {status}"
        retry_after = response.headers.get("Retry-After")
      elif status in _EXPIRED_STATUS and not refreshed and _on_storage_host(location):
        refreshed = True  # The storage host's signed URL expired: ask the Hub for a new one, once.
        _location(path, refresh=True)
        continue
      elif status == 200:
        raise HubReadError(f"bytes {start}-{stop}: {urlsplit(location).netloc} ignored the range request (HTTP 200"
                           " with the whole file)")
      else:
        message = response.headers.get("X-Error-Message") or response.reason or ""
        raise HubReadError(f"bytes {start}-{stop}: HTTP {status} from {urlsplit(location).netloc}"
                           + (f": {message}" if message else ""))
    except (urllib3.exceptions.HTTPError, OSError) as e:
      if isinstance(e, HubReadError):
        raise
      why = f"connection lost: {_first_line(e)}"
    finally:
      if response is not None:
        response.release_conn() if received == len(into) else response.close()
      with _lock:
        _stats.bytes += received
    start += received
    into = into[received:]
    if attempt >= _settings.max_retries:
      raise HubReadError(f"bytes {start}-{stop}: {why}, still after {attempt} retries")
    delay = _retry_delay(attempt, retry_after)
    attempt += 1
    with _lock:
      _stats.retries += 1
      reason = "connection lost" if why.startswith("connection lost") else why
      _stats.reasons[reason] = _stats.reasons.get(reason, 0) + 1
    logging.warning("%s: bytes %d-%d: %s; retry %d of %d in %.1f s", path, start, stop, why, attempt,
                    _settings.max_retries, delay)
    time.sleep(delay)


def read_into(path: str, start: int, into: memoryview) -> None:
  """Fills `into` with the bytes from `start` of the file at `path`, in parts fetched in parallel."""
  part = _settings.part_bytes
  if len(into) <= part:
    _fetch(path, start, into)
    return
  pool = _parts_pool()
  futures = [pool.submit(_fetch, path, start + offset, into[offset:offset + part])
             for offset in range(0, len(into), part)]
  try:
    for future in futures:
      future.result()
  finally:
    for future in futures:
      future.cancel()


def read_array(path: str, start: int, stop: int) -> np.ndarray:
  """Bytes [start, stop) of the file as a fresh uint8 array (a tensor region's), its pages first touched by the
  reads that fill it: no zeroing pass, no copy."""
  array = np.empty(max(0, stop - start), np.uint8)
  read_into(path, start, memoryview(array))
  return array


def read_bytes(path: str, start: int, stop: int | None) -> bytes:
  """Bytes [start, stop) of the file (to its end when `stop` is None): a header's, a config's."""
  return read_array(path, start, size(path) if stop is None else stop).tobytes()


def forget() -> None:
  """Forgets every file's metadata and local copy, and the counts: the next read asks afresh (tests)."""
  global _stats
  local_copy.cache_clear()
  _metadatas.clear()
  _stats = Stats()
