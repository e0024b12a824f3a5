"""The counting proxy forwards requests unchanged, counts them per method, and holds each one its latency."""

import http.server
import threading
import time
import urllib.request

from absl.testing import absltest

from tools.request_proxy import RequestProxy

_BODY = bytes(range(256)) * 40


class _Origin(http.server.BaseHTTPRequestHandler):
  protocol_version = "HTTP/1.1"

  def log_message(self, *args) -> None:  # pylint: disable=arguments-differ
    del args

  def do_GET(self) -> None:  # pylint: disable=invalid-name
    start, _, stop = self.headers.get("Range", "bytes=0-").removeprefix("bytes=").partition("-")
    body = _BODY[int(start):int(stop) + 1 if stop else None]
    self.send_response(206 if "Range" in self.headers else 200)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def do_POST(self) -> None:  # pylint: disable=invalid-name
    body = self.rfile.read(int(self.headers["Content-Length"]))
    self.send_response(200)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body[::-1])


class RequestProxyTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.origin = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Origin)
    threading.Thread(target=self.origin.serve_forever, daemon=True).start()
    self.addCleanup(self.origin.server_close)
    self.addCleanup(self.origin.shutdown)

  def test_forwards_counts_and_delays(self):
    with RequestProxy(f"http://127.0.0.1:{self.origin.server_address[1]}", latency_s=0.05, keep_log=True) as proxy:
      start = time.monotonic()
      ranged = urllib.request.Request(f"{proxy.url}/o/x", headers={"Range": "bytes=10-19"})
      with urllib.request.urlopen(ranged, timeout=10) as response:
        self.assertEqual(response.read(), _BODY[10:20])
      self.assertGreaterEqual(time.monotonic() - start, 0.05)
      with urllib.request.urlopen(f"{proxy.url}/o/y", timeout=10) as response:
        self.assertEqual(response.read(), _BODY)
      posted = urllib.request.Request(f"{proxy.url}/u", data=b"abc", method="POST")
      with urllib.request.urlopen(posted, timeout=10) as response:
        self.assertEqual(response.read(), b"cba")
    self.assertEqual(proxy.counts.requests, {"GET": 2, "POST": 1})
    self.assertEqual(proxy.counts.gets, 2)
    self.assertEqual(proxy.counts.ranged_gets, 1)
    self.assertEqual(proxy.counts.get_bytes, 10 + len(_BODY))
    self.assertEqual([entry[:3] for entry in proxy.log],
                     [("GET", "/o/x", "bytes=10-19"), ("GET", "/o/y", ""), ("POST", "/u", "")])


if __name__ == "__main__":
  absltest.main()
