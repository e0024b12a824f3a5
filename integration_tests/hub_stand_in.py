"""A local stand-in for the Hugging Face Hub's file endpoint (`/{repo}/resolve/{revision}/{file}`), on 127.0.0.1,
serving a directory per repo and answering as the Hub does (commit and ETag headers, error codes), and recording
every file requested; and an HF cache laid out exactly as huggingface_hub lays it out."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import threading
import urllib.parse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class HubStandIn:
  """`with HubStandIn({"org/name": directory}) as hub:` then HF_ENDPOINT=hub.url."""

  def __init__(self, repos: dict[str, str]):
    self.repos = repos
    self.requested: list[str] = []
    self.authorizations: set[str] = set()
    stand_in = self

    class Handler(http.server.BaseHTTPRequestHandler):

      def log_message(self, *args):
        del args

      def _tree(self, parts: list[str]) -> None:
        """`/api/models/{org}/{name}/tree/{revision}`: the repo's top-level files, as list_repo_files reads them."""
        directory = stand_in.repos.get("/".join(parts[2:4]))
        if directory is None or parts[5] not in ("main", COMMIT):
          self.send_error(404)
          return
        stand_in.requested.append("/".join(parts[:4]) + "/tree")
        entries = [{"type": "file", "path": name, "size": os.path.getsize(os.path.join(directory, name)),
                    "oid": hashlib.sha1(name.encode()).hexdigest()}
                   for name in sorted(os.listdir(directory)) if os.path.isfile(os.path.join(directory, name))]
        data = json.dumps(entries).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def _answer(self, body: bool) -> None:
        path = urllib.parse.unquote(urllib.parse.urlparse(self.path).path).lstrip("/")
        parts = path.split("/")
        if body and len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] == "tree":
          self._tree(parts)
          return
        if len(parts) < 5 or parts[2] != "resolve":
          self.send_error(404)
          return
        repo, revision, filename = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        if body:
          stand_in.requested.append(filename)
        stand_in.authorizations.add(self.headers.get("Authorization", ""))
        directory = stand_in.repos.get(repo)
        if directory is None:
          self.send_response(401)  # The Hub's answer for a repo that does not exist (or is private).
          self.send_header("X-Error-Code", "RepoNotFound")
          self.send_header("Content-Length", "0")
          self.end_headers()
          return
        if revision not in ("main", COMMIT):
          self.send_response(404)
          self.send_header("X-Error-Code", "RevisionNotFound")
          self.send_header("Content-Length", "0")
          self.end_headers()
          return
        file_path = os.path.join(directory, filename)
        if not os.path.isfile(file_path):
          self.send_response(404)
          self.send_header("X-Error-Code", "EntryNotFound")
          self.send_header("X-Repo-Commit", COMMIT)
          self.send_header("Content-Length", "0")
          self.end_headers()
          return
        with open(file_path, "rb") as f:
          data = f.read()
        self.send_response(200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if body:
          self.wfile.write(data)

      def do_HEAD(self):  # pylint: disable=invalid-name
        self._answer(body=False)

      def do_GET(self):  # pylint: disable=invalid-name
        self._answer(body=True)

    self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self._server.server_address[1]}"

  def __enter__(self) -> "HubStandIn":
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._server.shutdown()
    self._server.server_close()


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
