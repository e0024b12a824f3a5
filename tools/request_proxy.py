"""An HTTP proxy on 127.0.0.1 in front of a storage endpoint (the GCS emulator) that counts the requests passing
through it and can hold each one for a fixed latency, as a bucket in another building would.

The restore benchmark gives every restoring process its own proxy: the count is then that host's requests, which
is what a bucket bills and what its latency multiplies, and it is counted where the requests really are (Orbax
turns on tensorstore's read coalescing for buckets only, so a local restore's read calls say little about them).
"""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import socketserver
import threading
import time
import urllib.parse

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
               "transfer-encoding", "upgrade"}


@dataclasses.dataclass
class Counts:
  """What went through one proxy: requests by method, and the response body bytes of the GETs."""

  requests: dict[str, int] = dataclasses.field(default_factory=dict)
  ranged_gets: int = 0
  get_bytes: int = 0

  @property
  def gets(self) -> int:
    return self.requests.get("GET", 0)


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
  daemon_threads = True
  allow_reuse_address = True


class RequestProxy:
  """`with RequestProxy(upstream_url, latency_s=0.03) as proxy:` point a client at `proxy.url`; `proxy.counts`."""

  def __init__(self, upstream: str, latency_s: float = 0.0, keep_log: bool = False):
    parsed = urllib.parse.urlsplit(upstream)
    self._upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
    self.latency_s = latency_s
    self.counts = Counts()
    # With keep_log: (method, path, Range header, body bytes) of every request, in the order they were answered.
    self.log: list[tuple[str, str, str, int]] | None = [] if keep_log else None
    self._lock = threading.Lock()
    self._server = _Server(("127.0.0.1", 0), self._handler())
    self._thread: threading.Thread | None = None

  @property
  def url(self) -> str:
    return f"http://127.0.0.1:{self._server.server_address[1]}"

  def _record(self, method: str, path: str, byte_range: str | None, body_bytes: int) -> None:
    ranged = byte_range is not None
    with self._lock:
      if self.log is not None:
        self.log.append((method, path, byte_range or "", body_bytes))
      self.counts.requests[method] = self.counts.requests.get(method, 0) + 1
      if method == "GET":
        self.counts.ranged_gets += ranged
        self.counts.get_bytes += body_bytes

  def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
    proxy = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"

      def log_message(self, *args) -> None:  # pylint: disable=arguments-differ
        del args

      def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        if proxy.latency_s:
          time.sleep(proxy.latency_s)
        upstream = http.client.HTTPConnection(*proxy._upstream, timeout=300)  # pylint: disable=protected-access
        try:
          upstream.request(self.command, self.path, body=body, headers=headers)
          response = upstream.getresponse()
          data = response.read()
        finally:
          upstream.close()
        proxy._record(self.command, self.path, self.headers.get("Range"), len(data))  # pylint: disable=protected-access
        self.send_response(response.status, response.reason)
        for k, v in response.getheaders():
          if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length":
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
          self.wfile.write(data)

      do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _forward

    return Handler

  def start(self) -> "RequestProxy":
    self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
    self._thread.start()
    return self

  def stop(self) -> None:
    self._server.shutdown()
    self._server.server_close()
    if self._thread is not None:
      self._thread.join(timeout=10)

  def __enter__(self) -> "RequestProxy":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()
