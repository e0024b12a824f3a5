"""Tests for tools/gcs_emulator.py: it starts on a port nobody else holds, and keeps its buckets across a restart."""

import socket
import urllib.request

from absl.testing import absltest

from tools import gcs_emulator


class GcsEmulatorTest(absltest.TestCase):

  def test_another_port_when_its_own_is_taken_and_the_same_buckets_after_a_restart(self):
    gcs = gcs_emulator.GcsEmulator(self.create_tempdir().full_path)
    taken = gcs.port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
      squatter.bind(("127.0.0.1", taken))
      squatter.listen()
      with gcs:
        self.assertNotEqual(gcs.port, taken)
        gcs.create_bucket("kept")
        gcs.stop()
        gcs.start()
        with urllib.request.urlopen(f"{gcs.url}/storage/v1/b/kept", timeout=5) as response:
          self.assertEqual(response.status, 200)


if __name__ == "__main__":
  absltest.main()
