"""A local stand-in for the Hugging Face Hub on 127.0.0.1, speaking the endpoints huggingface_hub 2.4 calls:
downloads (`/{repo}/resolve/{revision}/{file}`, with commit and ETag headers and the Hub's error codes), the file
listing and repo info, and uploads as the Hub takes them with Xet turned off (HF_HUB_DISABLE_XET=1: the git LFS
batch API, single-part and multipart transfers, the Hub's preupload and NDJSON commit endpoints, repo and branch
creation, the model card check). It records every file requested and every LFS object sent, and lays out an HF
cache exactly as huggingface_hub does.

Like the Hub, it answers a `*.safetensors` file's resolve (an LFS file) with a 302 to a second host, its storage
(`storage_url`), at a signed-looking URL naming the file's sha256; that host needs no token, answers byte ranges
(206, 416) and whole files, and is where a test limits the link (`LinkLimits`), queues faults (`faults`) or holds
a read (`hold_range`). Every other file is answered by the main host itself, which is never limited.

Objects and files live on disk, a committed file being a link to the object sent. Branches point at commits and
every commit keeps its own directory of links, so an old commit stays readable by its id after a branch moved (by
an upload or by `commit`). Repos given to the constructor serve their directory on `main` at COMMIT; the rest lives
in the stand-in's own temporary directory. Used by integration_tests/hub_test.py and by the benchmark's way back to
a Hub repo (tools/benchmark.py --hub).
"""

from __future__ import annotations

import base64
import dataclasses
import errno
import hashlib
import http.server
import json
import os
import re
import shutil
import tempfile
import threading
import time
from typing import Callable
import urllib.parse

COMMIT = "0123456789abcdef0123456789abcdef01234567"
BAD_TOKEN = "Invalid credentials in Authorization header"  # The Hub's message, which huggingface_hub matches.
_PACED_CHUNK = 64 << 10  # A limited link's bodies go out in pieces this small, so the pace is smooth.
_CHUNK = 1 << 20
_SIGNED_URL_SECONDS = 3600  # How long a redirect's URL says it stays valid, as the Hub's signed URLs do.


@dataclasses.dataclass(frozen=True)
class LinkLimits:
  """What a machine's link to the Hub allows, applied to the storage host's bodies (the bytes of weights)."""
  per_connection_bytes_per_s: float | None = None  # each connection's body paced to this
  latency_s: float = 0.0  # added before each storage-host answer (a request's round trip)
  aggregate_bytes_per_s: float | None = None  # all connections together (one shared token bucket)


class _TokenBucket:
  """All connections' bodies together at `rate` bytes/s. A piece takes its bytes at once, even into debt, and its
  sender sleeps the debt off: no sender waits on another's sleep, so concurrent bodies share the rate evenly. It
  holds at most one piece, so no burst outruns the rate after an idle spell."""

  def __init__(self, rate: float):
    self._rate = rate
    self._lock = threading.Lock()
    self._available = 0.0
    self._last = time.monotonic()

  def take(self, count: int) -> None:
    with self._lock:
      now = time.monotonic()
      self._available = min(self._available + (now - self._last) * self._rate, _PACED_CHUNK) - count
      self._last = now
      debt = -self._available / self._rate
    if debt > 0:
      time.sleep(debt)


def _link_or_copy(source: str, target: str) -> None:
  """The stored object itself where it can be (no second copy of a large file); a repo's directory given by the
  caller may be on another file system (a test's own temporary directory under Bazel's sandbox)."""
  os.makedirs(os.path.dirname(target), exist_ok=True)
  try:
    os.link(source, target)
  except OSError as e:
    if e.errno != errno.EXDEV:
      raise
    shutil.copyfile(source, target)


def _files_under(directory: str) -> list[str]:
  """Every file below `directory`, as repo paths (`sub/name`)."""
  return sorted(os.path.relpath(os.path.join(parent, name), directory).replace(os.sep, "/")
                for parent, _, names in os.walk(directory) for name in names)


def _byte_range(header: str, size: int) -> tuple[int, int] | None:
  """`Range: bytes=a-b` (or `a-`, or `-n`: the last n bytes) as (first byte, one past the last) within `size`, or
  None when no byte of it is in the file (416). One range only: no client here asks for several at once."""
  match = re.fullmatch(r"bytes=(\d*)-(\d*)", header.strip())
  if not match or match.groups() == ("", "") or (all(match.groups()) and int(match[2]) < int(match[1])):
    raise ValueError(f"the stand-in reads one byte range, not {header!r}")
  if not match[1]:
    suffix = int(match[2])
    return (max(size - suffix, 0), size) if suffix and size else None
  first = int(match[1])
  if first >= size:
    return None
  return first, size if not match[2] else min(int(match[2]) + 1, size)


class _Server(http.server.ThreadingHTTPServer):
  daemon_threads = True
  request_queue_size = 128  # A conversion opens dozens of connections at once.


class _Handler(http.server.BaseHTTPRequestHandler):
  """What both hosts' answers share: HTTP/1.1 with keep-alive, a length on every body, byte ranges of files, and
  silence when a client goes away mid-answer (a test kills the converter)."""
  protocol_version = "HTTP/1.1"
  # Headers and body go out in two writes: with Nagle's algorithm the second waits for the client's delayed ACK
  # of the first, 40 ms on every small answer over a kept-alive connection.
  disable_nagle_algorithm = True
  hub: HubStandIn  # Set on the subclass each stand-in makes for its servers.

  def log_message(self, *args):
    del args

  def handle_one_request(self):
    try:
      super().handle_one_request()
    except (BrokenPipeError, ConnectionResetError):
      self.close_connection = True

  def _path_parts(self) -> list[str]:
    """The URL's path segments, each unquoted on its own (a branch named `a/b` comes as `a%2Fb`)."""
    return [urllib.parse.unquote(p) for p in urllib.parse.urlparse(self.path).path.lstrip("/").split("/")]

  def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
    """The answer with `body`; to a HEAD, its length alone (a body there would be read as the next answer)."""
    self.send_response(status)
    for key, value in (headers or {}).items():
      self.send_header(key, value)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    if self.command != "HEAD":
      self.wfile.write(body)

  def _json(self, value, status: int = 200) -> None:
    self._send(status, json.dumps(value).encode(), {"Content-Type": "application/json"})

  def _error(self, status: int, code: str | None = None, message: str | None = None,
             headers: dict[str, str] | None = None) -> None:
    headers = dict(headers or {})
    if code:
      headers["X-Error-Code"] = code
    if message:
      headers["X-Error-Message"] = message
    self._send(status, json.dumps({"error": message or code or "error"}).encode(), headers)

  def _file_head(self, path: str, headers: dict[str, str]) -> tuple[int, int] | None:
    """Sends the status and headers for the file at `path`, or for the bytes its Range asks for (206). Returns the
    body's (first byte, one past the last) to send, or None when the answer is complete (416, a bad Range)."""
    size = os.path.getsize(path)
    headers = {**headers, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
    status, first, end = 200, 0, size
    if "Range" in self.headers:
      try:
        span = _byte_range(self.headers["Range"], size)
      except ValueError as e:
        self._error(400, message=str(e))
        return None
      if span is None:
        self._send(416, b"", {"Content-Range": f"bytes */{size}"})
        return None
      (first, end), status = span, 206
      headers["Content-Range"] = f"bytes {first}-{end - 1}/{size}"
    self.send_response(status)
    for key, value in headers.items():
      self.send_header(key, value)
    self.send_header("Content-Length", str(end - first))
    self.end_headers()
    return first, end

  def _write_file(self, path: str, first: int, count: int, link: LinkLimits | None = None,
                  bucket: _TokenBucket | None = None) -> int:
    """Writes `count` bytes of the file at `path` from `first`, paced to `link` and `bucket` when given. Returns
    how many went out before the client went away."""
    rate = link.per_connection_bytes_per_s if link else None
    piece = _PACED_CHUNK if rate or bucket else _CHUNK
    start, sent = time.monotonic(), 0
    with open(path, "rb") as f:
      f.seek(first)
      while sent < count:
        data = f.read(min(piece, count - sent))
        if not data:
          break
        if bucket:
          bucket.take(len(data))
        try:
          self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
          self.close_connection = True
          break
        sent += len(data)
        if rate:
          time.sleep(max(0.0, start + sent / rate - time.monotonic()))
    return sent


class _HubHandler(_Handler):
  """The Hub itself: resolve, the API, uploads."""

  # GET and HEAD --------------------------------------------------------------------------------------------------
  def do_HEAD(self):  # pylint: disable=invalid-name
    self._answer(body=False)

  def do_GET(self):  # pylint: disable=invalid-name
    self._answer(body=True)

  def _answer(self, body: bool) -> None:
    parts = self._path_parts()
    if body and len(parts) >= 4 and parts[:2] == ["api", "models"]:
      self._api_get(parts)
      return
    if len(parts) < 5 or parts[2] != "resolve":
      self._error(404)
      return
    hub = self.hub
    repo, revision, filename = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
    hub.resolves.append((self.command, filename, revision))
    redirected = filename.endswith(".safetensors")  # LFS files: their bytes come from the storage host.
    if body and not redirected:
      hub.requested.append(filename)
    branch = self._readable(repo, revision)
    if branch is None:
      return
    file_path = os.path.join(branch[1], filename)
    if not os.path.isfile(file_path):
      self._send(404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": branch[0]})
      return
    digest = hub._digest(file_path)
    if redirected:
      location = (f"{hub.storage_url}/{digest}/{urllib.parse.quote(filename)}"
                  f"?expires={int(time.time()) + _SIGNED_URL_SECONDS}")
      message = f"Found. Redirecting to {location}".encode()
      self._send(302, message, {
          "Location": location, "X-Repo-Commit": branch[0], "X-Linked-Etag": f'"{digest}"',
          "X-Linked-Size": str(os.path.getsize(file_path)), "ETag": f'"{hashlib.sha1(message).hexdigest()}"',
          "Content-Type": "text/plain; charset=utf-8"})
      return
    span = self._file_head(file_path, {"X-Repo-Commit": branch[0], "ETag": f'"{digest}"'})
    if span and body:
      self._write_file(file_path, span[0], span[1] - span[0])

  def _readable(self, repo: str, revision: str) -> list[str] | None:
    """[commit, directory] of `revision` in `repo`; None once answered as the Hub answers a token it does not
    know, a repo that does not exist or that this request may not read (private: as if absent; gated: 403), or a
    revision the repo does not have."""
    hub = self.hub
    auth = self.headers.get("Authorization", "")
    hub.authorizations.add(auth)
    token = auth.removeprefix("Bearer ")
    if token and hub.tokens is not None and token not in hub.tokens | hub.read_tokens:
      self._error(401, message=BAD_TOKEN)
      return None
    if repo not in hub.branches or (repo in hub._private_reads and token not in hub.read_tokens):
      self._error(401, "RepoNotFound")  # The Hub's answer for a repo that does not exist (or is private).
      return None
    if repo in hub.gated and token not in hub.read_tokens:
      self._error(403, "GatedRepo", (
          f"Access to model {repo} is restricted and you are not in the authorized list. Visit {hub.url}/{repo} "
          "to ask for access." if token else
          f"Access to model {repo} is restricted. You must have access to it and be authenticated to access it. "
          "Please log in."))
      return None
    branch = hub._branch(repo, revision)
    if branch is None:
      self._error(404, "RevisionNotFound")
    return branch

  def _api_get(self, parts: list[str]) -> None:
    """`/api/models/{repo}` and `.../revision/{rev}` (repo info), `.../tree/{rev}` (its top-level files)."""
    hub = self.hub
    repo = "/".join(parts[2:4])
    branch = self._readable(repo, parts[5] if len(parts) > 5 else "main")
    if branch is None:
      return
    files = []  # Size, and an LFS file's sha256, as the Hub lists them (the repo info's with ?blobs=true).
    for name in sorted(n for n in os.listdir(branch[1]) if os.path.isfile(os.path.join(branch[1], n))):
      path = os.path.join(branch[1], name)
      files.append({"path": name, "size": os.path.getsize(path), "oid": hashlib.sha1(name.encode()).hexdigest()})
      if name.endswith(".safetensors"):
        files[-1]["lfs"] = {"oid": hub._digest(path), "size": files[-1]["size"], "pointerSize": 134}
    if len(parts) > 4 and parts[4] == "tree":
      hub.requested.append("/".join(parts[:4]) + "/tree")
      self._json([{"type": "file", **f} for f in files])
    else:
      self._json({"id": repo, "modelId": repo, "sha": branch[0], "private": hub.private[repo],
                  "gated": "manual" if repo in hub.gated else False,
                  "siblings": [{"rfilename": f["path"], "size": f["size"], "blobId": f["oid"],
                                **({"lfs": {"sha256": f["lfs"]["oid"], "size": f["size"], "pointerSize": 134}}
                                   if "lfs" in f else {})} for f in files]})

  # POST and PUT --------------------------------------------------------------------------------------------------
  def _body(self) -> bytes:
    return self.rfile.read(int(self.headers.get("Content-Length") or 0))

  def _body_to_file(self, path: str) -> str:
    """Streams the request's body into `path` (objects of several GB stay off the memory); its sha256."""
    remaining, digest = int(self.headers.get("Content-Length") or 0), hashlib.sha256()
    with open(path, "wb") as f:
      while remaining:
        data = self.rfile.read(min(remaining, 8 << 20))
        if not data:
          break
        digest.update(data)
        f.write(data)
        remaining -= len(data)
    return digest.hexdigest()

  def _authorized(self) -> bool:
    """Writes: refused with the Hub's answer to a token it does not know."""
    auth = self.headers.get("Authorization", "")
    self.hub.authorizations.add(auth)
    if self.hub.tokens is not None and auth.removeprefix("Bearer ") not in self.hub.tokens:
      self._error(401, message=BAD_TOKEN)
      return False
    return True

  def do_POST(self):  # pylint: disable=invalid-name
    parts = self._path_parts()
    path = "/".join(parts)
    body = self._body()
    if parts[0] == "lfs-upload":
      self._complete_multipart(parts[1], json.loads(body))
      return
    if parts[0] == "lfs-verify":
      oid = json.loads(body)["oid"]
      self._send(200 if oid in self.hub.lfs else 404)
      return
    if not self._authorized():
      return
    if parts[:3] == ["api", "repos", "create"]:
      self._create_repo(json.loads(body))
    elif parts[:2] == ["api", "validate-yaml"]:  # A README.md's model card metadata, checked before a commit.
      self._json({"errors": [], "warnings": []})
    elif path.endswith(".git/info/lfs/objects/batch"):
      self._batch(json.loads(body))
    elif parts[:2] == ["api", "models"] and len(parts) >= 6:
      repo, action, revision = "/".join(parts[2:4]), parts[4], "/".join(parts[5:])
      if repo not in self.hub.branches:
        self._error(404, "RepoNotFound")
      elif action == "preupload":
        self._preupload(json.loads(body))
      elif action == "commit":
        self._commit(repo, revision, body)
      elif action == "branch":
        self._create_branch(repo, revision, json.loads(body or b"{}"))
      else:
        self._error(404)
    else:
      self._error(404)

  def do_PUT(self):  # pylint: disable=invalid-name
    hub = self.hub
    parts = self._path_parts()
    with hub._lock:
      hub.uploads.append(parts[1])
      number = len(hub.uploads)
    if number == hub.hold_upload:
      hub.holding.set()
      hub._release.wait(60)
      self.close_connection = True
      return  # Dropped: the uploader was stopped meanwhile.
    if parts[0] != "lfs-upload":
      self._error(404)
      return
    part = int(parts[3]) if len(parts) == 4 and parts[2] == "part" else None
    path = hub._object_path(parts[1], part)
    digest = self._body_to_file(path)
    if part is not None:
      with hub._lock:
        hub._parts.setdefault(parts[1], {})[part] = path
      self._send(200, b"", {"ETag": f'"{digest}"'})
    elif digest != parts[1]:
      os.remove(path)
      self._error(400, message="content does not match its sha256")
    else:
      hub._stored(parts[1], path)
      self._send(200)

  def _complete_multipart(self, oid: str, payload: dict) -> None:
    hub = self.hub
    parts = hub._parts.pop(oid, {})
    numbers = [p["partNumber"] for p in payload["parts"]]
    path, digest = hub._object_path(oid), hashlib.sha256()
    with open(path, "wb") as f:
      for number in numbers:
        with open(parts.get(number, os.devnull), "rb") as piece:
          while data := piece.read(8 << 20):
            digest.update(data)
            f.write(data)
    for piece_path in parts.values():
      os.remove(piece_path)
    if sorted(parts) != numbers or digest.hexdigest() != oid:
      os.remove(path)
      self._error(400, message="parts missing or not matching the sha256")
      return
    hub._stored(oid, path)
    self._json({"success": True})

  def _create_repo(self, payload: dict) -> None:
    hub = self.hub
    repo = f"{payload['organization']}/{payload['name']}" if payload.get("organization") else payload["name"]
    if repo in hub.branches:  # The Hub's answer, which names the repo's URL too.
      self._json({"error": "You already created this model repo", "url": f"{hub.url}/{repo}"}, 409)
      return
    commit = hashlib.sha1(repo.encode()).hexdigest()
    directory = os.path.join(hub._root, repo.replace("/", "--"), commit)
    os.makedirs(directory)
    hub._commits_of[repo] = {commit: directory}
    hub.branches[repo] = {"main": [commit, directory]}
    hub.private[repo] = payload.get("visibility") == "private" or bool(payload.get("private"))
    self._json({"url": f"{hub.url}/{repo}", "name": repo, "id": repo})

  def _create_branch(self, repo: str, branch: str, payload: dict) -> None:
    branches = self.hub.branches[repo]
    if branch in branches:
      self._error(409, message=f"Reference refs/heads/{branch} already exists")
      return
    start = self.hub._branch(repo, payload.get("startingPoint") or "main")
    if start is None:
      self._error(404, "RevisionNotFound")
      return
    branches[branch] = list(start)  # The same commit: its files are not copied.
    self._json({})

  def _preupload(self, payload: dict) -> None:
    self._json({"files": [{"path": f["path"], "shouldIgnore": False,
                           "uploadMode": "lfs" if f["path"].endswith(".safetensors") or f["size"] > 10 << 20
                           else "regular"} for f in payload["files"]]})

  def _batch(self, payload: dict) -> None:
    hub = self.hub
    objects = []
    for obj in payload["objects"]:
      oid, size = obj["oid"], obj["size"]
      entry = {"oid": oid, "size": size}
      if oid not in hub.lfs:  # Already stored: no actions, and the client sends nothing.
        href = f"{hub.url}/lfs-upload/{oid}"
        header = {}
        if size > hub.multipart_bytes:
          count = -(-size // hub.multipart_bytes)
          header = {"chunk_size": str(hub.multipart_bytes),
                    **{str(n): f"{href}/part/{n}" for n in range(1, count + 1)}}
        entry["actions"] = {"upload": {"href": href, "header": header},
                            "verify": {"href": f"{hub.url}/lfs-verify/{oid}", "header": {}}}
      objects.append(entry)
    self._json({"transfer": "basic", "objects": objects})

  def _commit(self, repo: str, revision: str, body: bytes) -> None:
    hub = self.hub
    lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
    header = lines[0]["value"]
    branch = hub.branches[repo].get(revision)
    if branch is None:
      self._error(404, "RevisionNotFound")
      return
    if header.get("parentCommit") and header["parentCommit"] != branch[0]:
      self._error(412, message="A commit has happened since. Please refresh and try again.")
      return
    missing = [v["value"]["path"] for v in lines[1:] if v["key"] == "lfsFile" and v["value"]["oid"] not in hub.lfs]
    if missing:  # Refused whole, as the Hub refuses a commit naming an object it never received.
      self._error(422, message=f"LFS objects of {', '.join(missing)} were never uploaded")
      return
    unknown = [line["key"] for line in lines[1:] if line["key"] not in ("file", "lfsFile", "deletedFile")]
    if unknown:
      self._error(400, message=f"unknown key {unknown[0]}")
      return
    added = {line["value"]["path"]: base64.b64decode(line["value"]["content"]) if line["key"] == "file"
             else hub.lfs[line["value"]["oid"]] for line in lines[1:] if line["key"] != "deletedFile"}
    deleted = [line["value"]["path"] for line in lines[1:] if line["key"] == "deletedFile"]
    commit = hub._land(repo, revision, added, deleted)
    hub.commits.append({"header": header, "added": list(added), "deleted": deleted})
    self._json({"commitUrl": f"{hub.url}/{repo}/commit/{commit}", "commitOid": commit, "pullRequestUrl": None})


class _StorageHandler(_Handler):
  """The host the Hub redirects an LFS file's resolve to (its CDN or storage, by the file's sha256): byte ranges
  and whole files, paced to the link's limits, answering the faults a test queued, holding the read it names."""

  def do_HEAD(self):  # pylint: disable=invalid-name
    self._answer(body=False)

  def do_GET(self):  # pylint: disable=invalid-name
    self._answer(body=True)

  def _answer(self, body: bool) -> None:
    hub = self.hub
    if "Authorization" in self.headers:
      hub.storage_authorizations.append(self.headers["Authorization"])
    time.sleep(hub.link.latency_s)
    digest, _, name = "/".join(self._path_parts()).partition("/")
    path = hub._objects.get(digest)
    if path is None:
      self._error(404, message=f"no object {digest}")
      return
    if not body:
      self._file_head(path, {"ETag": f'"{digest}"'})
      return
    if "Range" in self.headers:
      number = hub._count_range()
      if hub.on_range is not None:
        hub.on_range(number)
      if number == hub.hold_range:
        hub.holding_range.set()
        hub._release.wait(300)
    else:
      hub.requested.append(name)
    fault = hub._next_fault()
    if isinstance(fault, int):
      self._error(fault, message=f"fault {fault} queued by the test",
                  headers={"Retry-After": "1"} if fault == 429 else None)
      return
    if fault not in (None, "drop"):
      self._error(500, message=f"unknown fault {fault!r} queued by the test")
      return
    span = self._file_head(path, {"ETag": f'"{digest}"'})
    if span is None:
      return
    first, end = span
    count = (end - first) // 2 if fault == "drop" else end - first
    planned = (name, first, first + count)
    hub._record_range(planned)  # Before the body: a client that has it all finds it recorded.
    sent = self._write_file(path, first, count, hub.link, hub._bucket)
    if sent < count:
      hub._record_range((name, first, first + sent), replacing=planned)
    if fault == "drop":
      self.close_connection = True  # Headers promised more: the client sees the connection cut mid-body.


class HubStandIn:
  """`with HubStandIn({"org/name": directory}) as hub:` then HF_ENDPOINT=hub.url.

  `tokens`: when given, writes need `Authorization: Bearer <one of them>` (401 otherwise, as the Hub answers), and
  a read with a bearer token in neither `tokens` nor `read_tokens` is refused the same way.
  `multipart_bytes`: LFS objects larger than this are sent in parts of that size (the Hub's multipart transfer).
  `hold_upload`: the 1-based number of the LFS upload request that waits until `release()` (a test interrupts
  the uploader meanwhile); `holding` is set when it arrives. `root_parent`: where its files go (a temporary
  directory there, removed on exit; by default the test's own TEST_TMPDIR, or the system's).
  `link`: the limits of the link to the storage host (the main host's answers are small and not limited).
  `gated`: repos answered 403 GatedRepo, and `private`: repos answered 401 RepoNotFound as if absent, unless the
  request's bearer token is in `read_tokens` (repos created private through the API stay readable: the tests that
  push read them back with the writing token).
  `hold_range`: the 1-based number of the storage host's ranged GET that waits until `release()` (`holding_range`
  is set when it arrives; a test kills the converter meanwhile).

  What it records, for the tests: `requested` (each file whose whole content was asked for, and each tree
  listing), `resolves` ((method, file, revision) of every resolve), `ranges` ((file, first byte, one past the last)
  of every body the storage host sent; `bytes_sent` their total), `authorizations` (on the main host) and
  `storage_authorizations` (on the storage host: none should reach it), `faults_served` (what was popped from
  `faults`), `uploads`, `lfs` and `commits` (what was pushed through the API). `on_range`, when set, is called
  with each ranged GET's number before it is answered.
  """

  def __init__(self, repos: dict[str, str], *, tokens: set[str] | None = None, multipart_bytes: int = 1 << 40,
               hold_upload: int | None = None, root_parent: str | None = None, link: LinkLimits | None = None,
               gated: set[str] = frozenset(), private: set[str] = frozenset(), read_tokens: set[str] = frozenset(),
               hold_range: int | None = None):
    self._root = tempfile.mkdtemp(prefix="hub-stand-in-", dir=root_parent or os.environ.get("TEST_TMPDIR"))
    # repo id -> branch -> [head commit, its directory]; repo id -> commit -> its directory (every commit kept).
    self.branches: dict[str, dict[str, list[str]]] = {r: {"main": [COMMIT, d]} for r, d in repos.items()}
    self._commits_of: dict[str, dict[str, str]] = {r: {COMMIT: d} for r, d in repos.items()}
    self.private: dict[str, bool] = {r: r in private for r in repos}
    self._private_reads = frozenset(private)
    self.gated = frozenset(gated)
    self.read_tokens = frozenset(read_tokens)
    self.requested: list[str] = []
    self.resolves: list[tuple[str, str, str]] = []
    self.authorizations: set[str] = set()
    self.storage_authorizations: list[str] = []
    self.lfs: dict[str, str] = {}  # sha256 -> the file holding that object as sent (complete objects only).
    os.makedirs(os.path.join(self._root, "lfs"))
    self.uploads: list[str] = []  # sha256 of every LFS upload request (a part counts once per part).
    self.commits: list[dict] = []  # Each API commit's header, and the paths it added and deleted.
    self.tokens = tokens
    self.multipart_bytes = multipart_bytes
    self.hold_upload = hold_upload
    self.holding = threading.Event()
    self.link = link or LinkLimits()
    self._bucket = _TokenBucket(self.link.aggregate_bytes_per_s) if self.link.aggregate_bytes_per_s else None
    self.hold_range = hold_range
    self.holding_range = threading.Event()
    self.on_range: Callable[[int], None] | None = None
    self.ranges: list[tuple[str, int, int]] = []
    self.faults: list[int | str] = []
    self.faults_served: list[int | str] = []
    self._ranged_gets = 0
    self._release = threading.Event()
    self._parts: dict[str, dict[int, str]] = {}
    self._lock = threading.Lock()
    self._commit_lock = threading.Lock()
    self._counter = 0
    self._digests: dict[tuple[int, int, int, int], str] = {}  # A file's (device, inode, size, mtime) -> sha256.
    self._objects: dict[str, str] = {}  # sha256 -> a file holding it, what the storage host serves.
    for directory in repos.values():  # Hashed now, not by the first resolve of a measured run.
      for name in _files_under(directory):
        if name.endswith(".safetensors"):
          self._digest(os.path.join(directory, name))
    self._server = _Server(("127.0.0.1", 0), type("HubHandler", (_HubHandler,), {"hub": self}))
    self._storage = _Server(("127.0.0.1", 0), type("StorageHandler", (_StorageHandler,), {"hub": self}))
    # Polled often: each test's stand-in stops at once (shutdown waits for the next poll).
    self._threads = [threading.Thread(target=s.serve_forever, args=(0.02,), daemon=True)
                     for s in (self._server, self._storage)]

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self._server.server_address[1]}"

  @property
  def storage_url(self) -> str:
    return f"http://127.0.0.1:{self._storage.server_address[1]}"

  @property
  def bytes_sent(self) -> int:
    with self._lock:
      return sum(end - first for _, first, end in self.ranges)

  def files(self, repo: str, branch: str = "main") -> dict[str, bytes]:
    """The files of `repo` at the head of `branch`."""
    directory = self.branches[repo][branch][1]
    result = {}
    for name in sorted(os.listdir(directory)):
      with open(os.path.join(directory, name), "rb") as f:
        result[name] = f.read()
    return result

  def commit(self, repo: str, files: dict[str, bytes], branch: str = "main") -> str:
    """Lands a commit on `branch` of `repo` with `files` added or replaced (the rest kept), as a push by someone
    else would while a conversion reads the repo; returns its id. The old commit stays readable by its id."""
    commit = self._land(repo, branch, files, ())
    directory = self._commits_of[repo][commit]
    for name in files:
      if name.endswith(".safetensors"):
        self._digest(os.path.join(directory, name))
    return commit

  def release(self) -> None:
    self._release.set()

  def __enter__(self) -> HubStandIn:
    for thread in self._threads:
      thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._release.set()
    for server in (self._server, self._storage):
      server.shutdown()
      server.server_close()
    shutil.rmtree(self._root, ignore_errors=True)

  # What the handlers share -----------------------------------------------------------------------------------------
  def _branch(self, repo: str, revision: str) -> list[str] | None:
    """[commit, directory] of a branch's head or of any commit `repo` ever had, by name or id."""
    branch = self.branches.get(repo, {}).get(revision)
    if branch is not None:
      return branch
    directory = self._commits_of.get(repo, {}).get(revision)
    return None if directory is None else [revision, directory]

  def _land(self, repo: str, branch: str, added: dict[str, bytes | str], deleted) -> str:
    """A new commit on `branch`: its head's files linked into a directory of its own, less `deleted`, with
    `added` (content, or the path of a stored object to link) written over them. Returns the commit's id."""
    with self._commit_lock:
      with self._lock:
        self._counter += 1
        commit = hashlib.sha1(f"{repo}@{self._counter}".encode()).hexdigest()
      head = self.branches[repo][branch][1]
      directory = os.path.join(self._root, repo.replace("/", "--"), commit)
      os.makedirs(directory)
      for name in _files_under(head):
        if name not in added and name not in deleted:
          _link_or_copy(os.path.join(head, name), os.path.join(directory, name))
      for name, content in added.items():
        target = os.path.join(directory, name)
        if isinstance(content, bytes):
          os.makedirs(os.path.dirname(target), exist_ok=True)
          with open(target, "wb") as f:
            f.write(content)
        else:
          _link_or_copy(content, target)
      self._commits_of[repo][commit] = directory
      self.branches[repo][branch] = [commit, directory]  # One assignment: a reader sees the old head or the new.
    return commit

  def _object_path(self, oid: str, part: int | None = None) -> str:
    return os.path.join(self._root, "lfs", oid if part is None else f"{oid}.part{part}")

  def _stored(self, oid: str, path: str) -> None:
    """An LFS object received whole: committed, its links need no hashing to be served."""
    self.lfs[oid] = path
    self._remember(path, oid)

  def _remember(self, path: str, digest: str) -> None:
    stat = os.stat(path)
    with self._lock:
      self._digests[(stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)] = digest
      self._objects.setdefault(digest, path)

  def _digest(self, path: str) -> str:
    """The sha256 of the file at `path` (an LFS object's id, its ETag), hashed once per file (a commit's unchanged
    files are links to the same inode); the storage host serves the file by it from then on."""
    stat = os.stat(path)
    digest = self._digests.get((stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns))
    if digest is None:
      sha256 = hashlib.sha256()
      with open(path, "rb") as f:
        while data := f.read(8 << 20):
          sha256.update(data)
      digest = sha256.hexdigest()
      self._remember(path, digest)
    return digest

  def _count_range(self) -> int:
    with self._lock:
      self._ranged_gets += 1
      return self._ranged_gets

  def _next_fault(self) -> int | str | None:
    with self._lock:
      if not self.faults:
        return None
      fault = self.faults.pop(0)
      self.faults_served.append(fault)
      return fault

  def _record_range(self, entry: tuple[str, int, int], replacing: tuple[str, int, int] | None = None) -> None:
    with self._lock:
      if replacing is None:
        self.ranges.append(entry)
      elif replacing in self.ranges:  # Not when the test cleared the list meanwhile.
        self.ranges[self.ranges.index(replacing)] = entry


def lay_out_cache(cache_dir: str, repo_id: str, files_dir: str, *, commit: str = COMMIT) -> str:
  """Puts `files_dir`'s files into `cache_dir` as huggingface_hub does: blobs named by their hash, a snapshot
  of relative symlinks to them, refs/main naming the commit. Returns the snapshot directory."""
  repo = os.path.join(cache_dir, "models--" + repo_id.replace("/", "--"))
  snapshot = os.path.join(repo, "snapshots", commit)
  os.makedirs(os.path.join(repo, "blobs"), exist_ok=True)
  os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
  os.makedirs(snapshot, exist_ok=True)
  for name in sorted(os.listdir(files_dir)):
    with open(os.path.join(files_dir, name), "rb") as f:
      data = f.read()
    blob = hashlib.sha256(data).hexdigest()
    with open(os.path.join(repo, "blobs", blob), "wb") as f:
      f.write(data)
    os.symlink(os.path.join("..", "..", "blobs", blob), os.path.join(snapshot, name))
  with open(os.path.join(repo, "refs", "main"), "w") as f:
    f.write(commit)
  return snapshot
