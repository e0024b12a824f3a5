"""A local stand-in for the Hugging Face Hub on 127.0.0.1, speaking the endpoints huggingface_hub 2.4 calls:
downloads (`/{repo}/resolve/{revision}/{file}`, with commit and ETag headers and the Hub's error codes), the file
listing and repo info, and uploads as the Hub takes them with Xet turned off (HF_HUB_DISABLE_XET=1: the git LFS
batch API, single-part and multipart transfers, the Hub's preupload and NDJSON commit endpoints, repo and branch
creation, the model card check). It records every file requested and every LFS object sent, and lays out an HF
cache exactly as huggingface_hub does.

Objects and files live on disk, a committed file being a link to the object sent. Repos given to the constructor
serve their directory on `main` at COMMIT; repos and branches created through the API live in the stand-in's own
temporary directory, one directory per branch, and each commit gets a new head. Used by integration_tests/hub_test.py
and by the benchmark's way back to a Hub repo (tools/benchmark.py --hub).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import http.server
import json
import os
import shutil
import tempfile
import threading
import urllib.parse

COMMIT = "0123456789abcdef0123456789abcdef01234567"
BAD_TOKEN = "Invalid credentials in Authorization header"  # The Hub's message, which huggingface_hub matches.


def _link_or_copy(source: str, target: str) -> None:
  """The stored object itself where it can be (no second copy of a large file); a repo's directory given by the
  caller may be on another file system (a test's own temporary directory under Bazel's sandbox)."""
  try:
    os.link(source, target)
  except OSError as e:
    if e.errno != errno.EXDEV:
      raise
    shutil.copyfile(source, target)


class HubStandIn:
  """`with HubStandIn({"org/name": directory}) as hub:` then HF_ENDPOINT=hub.url.

  `tokens`: when given, writes need `Authorization: Bearer <one of them>` (401 otherwise, as the Hub answers).
  `multipart_bytes`: LFS objects larger than this are sent in parts of that size (the Hub's multipart transfer).
  `hold_upload`: the 1-based number of the LFS upload request that waits until `release()` (a test interrupts
  the uploader meanwhile); `holding` is set when it arrives. `root_parent`: where its files go (a temporary
  directory there, removed on exit; by default the test's own TEST_TMPDIR, or the system's).
  """

  def __init__(self, repos: dict[str, str], *, tokens: set[str] | None = None, multipart_bytes: int = 1 << 40,
               hold_upload: int | None = None, root_parent: str | None = None):
    self._root = tempfile.mkdtemp(prefix="hub-stand-in-", dir=root_parent or os.environ.get("TEST_TMPDIR"))
    # repo id -> branch -> [head commit, directory]
    self.branches: dict[str, dict[str, list[str]]] = {r: {"main": [COMMIT, d]} for r, d in repos.items()}
    self.private: dict[str, bool] = {r: False for r in repos}
    self.requested: list[str] = []
    self.authorizations: set[str] = set()
    self.lfs: dict[str, str] = {}  # sha256 -> the file holding that object as sent (complete objects only).
    os.makedirs(os.path.join(self._root, "lfs"))
    self.uploads: list[str] = []  # sha256 of every LFS upload request (a part counts once per part).
    self.commits: list[dict] = []  # Each commit's header, and the paths it added and deleted.
    self.tokens = tokens
    self.multipart_bytes = multipart_bytes
    self.hold_upload = hold_upload
    self.holding = threading.Event()
    self._release = threading.Event()
    self._parts: dict[str, dict[int, bytes]] = {}
    self._lock = threading.Lock()
    self._counter = 0
    stand_in = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"
      # Headers and body go out in two writes: with Nagle's algorithm the second waits for the client's delayed
      # ACK of the first, 40 ms on every small answer over a kept-alive connection.
      disable_nagle_algorithm = True

      def log_message(self, *args):
        del args

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

      def _error(self, status: int, code: str | None = None, message: str | None = None) -> None:
        headers = {}
        if code:
          headers["X-Error-Code"] = code
        if message:
          headers["X-Error-Message"] = message
        self._send(status, json.dumps({"error": message or code or "error"}).encode(), headers)

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
        stand_in.authorizations.add(auth)
        if stand_in.tokens is not None and auth.removeprefix("Bearer ") not in stand_in.tokens:
          self._error(401, message=BAD_TOKEN)
          return False
        return True

      def _branch(self, repo: str, revision: str) -> list[str] | None:
        for name, branch in stand_in.branches.get(repo, {}).items():
          if revision in (name, branch[0]):
            return branch
        return None

      # GET and HEAD ------------------------------------------------------------------------------------------
      def _answer(self, body: bool) -> None:
        path = urllib.parse.unquote(urllib.parse.urlparse(self.path).path).lstrip("/")
        parts = path.split("/")
        if body and len(parts) >= 4 and parts[:2] == ["api", "models"]:
          self._api_get(parts)
          return
        if len(parts) < 5 or parts[2] != "resolve":
          self._error(404)
          return
        repo, revision, filename = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        if body:
          stand_in.requested.append(filename)
        stand_in.authorizations.add(self.headers.get("Authorization", ""))
        if repo not in stand_in.branches:
          self._error(401, "RepoNotFound")  # The Hub's answer for a repo that does not exist (or is private).
          return
        branch = self._branch(repo, revision)
        if branch is None:
          self._error(404, "RevisionNotFound")
          return
        file_path = os.path.join(branch[1], filename)
        if not os.path.isfile(file_path):
          self._send(404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": branch[0]})
          return
        with open(file_path, "rb") as f:
          data = f.read()
        headers = {"X-Repo-Commit": branch[0], "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                   "Content-Type": "application/octet-stream"}
        if body:
          self._send(200, data, headers)
        else:
          self.send_response(200)
          for key, value in headers.items():
            self.send_header(key, value)
          self.send_header("Content-Length", str(len(data)))
          self.end_headers()

      def _api_get(self, parts: list[str]) -> None:
        """`/api/models/{repo}` and `.../revision/{rev}` (repo info), `.../tree/{rev}` (its top-level files)."""
        repo = "/".join(parts[2:4])
        revision = parts[5] if len(parts) > 5 else "main"
        branch = self._branch(repo, revision) if repo in stand_in.branches else None
        if repo not in stand_in.branches or branch is None:
          self._error(404 if repo in stand_in.branches else 401,
                      "RevisionNotFound" if repo in stand_in.branches else "RepoNotFound")
          return
        names = sorted(n for n in os.listdir(branch[1]) if os.path.isfile(os.path.join(branch[1], n)))
        if len(parts) > 4 and parts[4] == "tree":
          stand_in.requested.append("/".join(parts[:4]) + "/tree")
          self._json([{"type": "file", "path": n, "size": os.path.getsize(os.path.join(branch[1], n)),
                       "oid": hashlib.sha1(n.encode()).hexdigest()} for n in names])
        else:
          self._json({"id": repo, "modelId": repo, "sha": branch[0], "private": stand_in.private[repo],
                      "siblings": [{"rfilename": n} for n in names]})

      def do_HEAD(self):  # pylint: disable=invalid-name
        self._answer(body=False)

      def do_GET(self):  # pylint: disable=invalid-name
        self._answer(body=True)

      # POST and PUT ------------------------------------------------------------------------------------------
      def do_POST(self):  # pylint: disable=invalid-name
        path = urllib.parse.unquote(urllib.parse.urlparse(self.path).path).lstrip("/")
        parts = path.split("/")
        body = self._body()
        if parts[0] == "lfs-upload":
          self._complete_multipart(parts[1], json.loads(body))
          return
        if parts[0] == "lfs-verify":
          oid = json.loads(body)["oid"]
          self._send(200 if oid in stand_in.lfs else 404)
          return
        if not self._authorized():
          return
        if parts[:3] == ["api", "repos", "create"]:
          self._create_repo(json.loads(body))
        elif parts[:2] == ["api", "validate-yaml"]:  # A README.md's model card metadata, checked before a commit.
          self._json({"errors": [], "warnings": []})
        elif path.endswith(".git/info/lfs/objects/batch"):
          self._batch(path[: -len(".git/info/lfs/objects/batch")], json.loads(body))
        elif parts[:2] == ["api", "models"] and len(parts) >= 6:
          repo, action, revision = "/".join(parts[2:4]), parts[4], "/".join(parts[5:])
          if repo not in stand_in.branches:
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
        parts = urllib.parse.unquote(urllib.parse.urlparse(self.path).path).lstrip("/").split("/")
        with stand_in._lock:
          stand_in.uploads.append(parts[1])
          number = len(stand_in.uploads)
        if number == stand_in.hold_upload:
          stand_in.holding.set()
          stand_in._release.wait(60)
          self.close_connection = True
          return  # Dropped: the uploader was stopped meanwhile.
        if parts[0] != "lfs-upload":
          self._error(404)
          return
        part = int(parts[3]) if len(parts) == 4 and parts[2] == "part" else None
        path = stand_in._object_path(parts[1], part)
        digest = self._body_to_file(path)
        if part is not None:
          with stand_in._lock:
            stand_in._parts.setdefault(parts[1], {})[part] = path
          self._send(200, b"", {"ETag": f'"{digest}"'})
        elif digest != parts[1]:
          os.remove(path)
          self._error(400, message="content does not match its sha256")
        else:
          stand_in.lfs[parts[1]] = path
          self._send(200)

      def _complete_multipart(self, oid: str, payload: dict) -> None:
        parts = stand_in._parts.pop(oid, {})
        numbers = [p["partNumber"] for p in payload["parts"]]
        path, digest = stand_in._object_path(oid), hashlib.sha256()
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
        stand_in.lfs[oid] = path
        self._json({"success": True})

      def _create_repo(self, payload: dict) -> None:
        repo = f"{payload['organization']}/{payload['name']}" if payload.get("organization") else payload["name"]
        if repo in stand_in.branches:  # The Hub's answer, which names the repo's URL too.
          self._json({"error": "You already created this model repo", "url": f"{stand_in.url}/{repo}"}, 409)
          return
        directory = os.path.join(stand_in._root, repo.replace("/", "--"), "main")
        os.makedirs(directory)
        stand_in.branches[repo] = {"main": [hashlib.sha1(repo.encode()).hexdigest(), directory]}
        stand_in.private[repo] = payload.get("visibility") == "private" or bool(payload.get("private"))
        self._json({"url": f"{stand_in.url}/{repo}", "name": repo, "id": repo})

      def _create_branch(self, repo: str, branch: str, payload: dict) -> None:
        branches = stand_in.branches[repo]
        if branch in branches:
          self._error(409, message=f"Reference refs/heads/{branch} already exists")
          return
        start = branches[payload.get("startingPoint") or "main"]
        directory = os.path.join(stand_in._root, repo.replace("/", "--"), branch)
        shutil.copytree(start[1], directory)
        branches[branch] = [start[0], directory]
        self._json({})

      def _preupload(self, payload: dict) -> None:
        self._json({"files": [{"path": f["path"], "shouldIgnore": False,
                               "uploadMode": "lfs" if f["path"].endswith(".safetensors") or f["size"] > 10 << 20
                               else "regular"} for f in payload["files"]]})

      def _batch(self, repo: str, payload: dict) -> None:
        objects = []
        for obj in payload["objects"]:
          oid, size = obj["oid"], obj["size"]
          entry = {"oid": oid, "size": size}
          if oid not in stand_in.lfs:  # Already stored: no actions, and the client sends nothing.
            href = f"{stand_in.url}/lfs-upload/{oid}"
            header = {}
            if size > stand_in.multipart_bytes:
              count = -(-size // stand_in.multipart_bytes)
              header = {"chunk_size": str(stand_in.multipart_bytes),
                        **{str(n): f"{href}/part/{n}" for n in range(1, count + 1)}}
            entry["actions"] = {"upload": {"href": href, "header": header},
                                "verify": {"href": f"{stand_in.url}/lfs-verify/{oid}", "header": {}}}
          objects.append(entry)
        del repo
        self._json({"transfer": "basic", "objects": objects})

      def _commit(self, repo: str, revision: str, body: bytes) -> None:
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        header = lines[0]["value"]
        branch = self._branch(repo, revision)
        if branch is None:
          self._error(404, "RevisionNotFound")
          return
        if header.get("parentCommit") and header["parentCommit"] != branch[0]:
          self._error(412, message="A commit has happened since. Please refresh and try again.")
          return
        missing = [v["value"]["path"] for v in lines[1:] if v["key"] == "lfsFile" and v["value"]["oid"] not in stand_in.lfs]
        if missing:  # Refused whole, as the Hub refuses a commit naming an object it never received.
          self._error(422, message=f"LFS objects of {', '.join(missing)} were never uploaded")
          return
        added, deleted = [], []
        for line in lines[1:]:
          value = line["value"]
          target = os.path.join(branch[1], value["path"])
          if os.path.exists(target):
            os.remove(target)
          if line["key"] == "file":
            with open(target, "wb") as f:
              f.write(base64.b64decode(value["content"]))
          elif line["key"] == "lfsFile":
            _link_or_copy(stand_in.lfs[value["oid"]], target)
          elif line["key"] == "deletedFile":
            deleted.append(value["path"])
            continue
          else:
            self._error(400, message=f"unknown key {line['key']}")
            return
          added.append(value["path"])
        with stand_in._lock:
          stand_in._counter += 1
          branch[0] = hashlib.sha1(f"{repo}{stand_in._counter}".encode()).hexdigest()
        stand_in.commits.append({"header": header, "added": added, "deleted": deleted})
        self._json({"commitUrl": f"{stand_in.url}/{repo}/commit/{branch[0]}", "commitOid": branch[0],
                    "pullRequestUrl": None})

    self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self._server.daemon_threads = True
    # Polled often: each test's stand-in stops at once (shutdown waits for the next poll).
    self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

  def _object_path(self, oid: str, part: int | None = None) -> str:
    return os.path.join(self._root, "lfs", oid if part is None else f"{oid}.part{part}")

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self._server.server_address[1]}"

  def files(self, repo: str, branch: str = "main") -> dict[str, bytes]:
    """The files of `repo` at the head of `branch`."""
    directory = self.branches[repo][branch][1]
    result = {}
    for name in sorted(os.listdir(directory)):
      with open(os.path.join(directory, name), "rb") as f:
        result[name] = f.read()
    return result

  def release(self) -> None:
    self._release.set()

  def __enter__(self) -> "HubStandIn":
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._release.set()
    self._server.shutdown()
    self._server.server_close()
    shutil.rmtree(self._root, ignore_errors=True)


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
