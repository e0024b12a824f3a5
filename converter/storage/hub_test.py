"""The Hub's paths, repo ids and errors in the user's words (reads through a stand-in: integration_tests/hub_test.py
and tools/hub_stand_in_test.py)."""

import os
import types
from unittest import mock

from absl.testing import absltest

from converter.errors import ConversionError
from converter.storage import hub
from tools import hub_stand_in


class PathTest(absltest.TestCase):

  def test_repo_ids_and_paths(self):
    missing = os.path.join(self.create_tempdir().full_path, "nothing")
    self.assertTrue(hub.looks_like_repo_id("Qwen/Qwen3-8B", missing))
    self.assertTrue(hub.looks_like_repo_id("deepseek-ai/DeepSeek-V3.1", missing))
    for value in ("models/a/b", "/abs/x", "./x/y", "x", "gs://b/x", "a/"):
      self.assertFalse(hub.looks_like_repo_id(value, missing), value)

  def test_an_existing_local_directory_wins(self):
    directory = self.create_tempdir().full_path
    os.makedirs(os.path.join(directory, "org", "name"))
    self.assertFalse(hub.looks_like_repo_id("org/name", os.path.join(directory, "org", "name")))

  def test_a_file_path_names_its_repo_commit_and_file(self):
    path = hub.path_of("org/Name-1.5B", "a" * 40, "sub/model.safetensors")
    self.assertEqual(path, f"hf://org/Name-1.5B@{'a' * 40}/sub/model.safetensors")
    self.assertEqual(hub.parse(path), hub.HubPath("org/Name-1.5B", "a" * 40, "sub/model.safetensors"))
    self.assertEqual(hub.parse("hf://org/name"), hub.HubPath("org/name", None, ""))
    self.assertEqual(hub.parse("hf://org/name@v2/"), hub.HubPath("org/name", "v2", ""))
    self.assertEqual(hub.parse("hf://org/name@v2").where, "org/name (revision v2)")
    for bad in ("hf://name", "hf://org/name@", "gs://org/name"):
      with self.assertRaisesRegex(ConversionError, "expected hf://ORG/NAME"):
        hub.parse(bad)


class ErrorTest(absltest.TestCase):

  def test_statuses_in_the_users_words_on_one_line(self):
    from huggingface_hub import errors  # pylint: disable=g-import-not-at-top

    def said(status, writing=True, message=""):
      return str(hub.error("hf://o/n", _HttpError(status, message), "committing", writing=writing))

    self.assertIn("refused the token (set HF_TOKEN to a valid token with write access",
                  said(401, message="Invalid credentials in Authorization header"))
    self.assertNotIn("write access", said(401, writing=False, message="Invalid credentials in Authorization header"))
    self.assertIn("may not write", said(403))
    self.assertIn("may not read", said(403, writing=False))
    self.assertIn("another commit landed", said(412))
    self.assertEqual(said(500), "hf://o/n: committing failed: _HttpError: 500 error")
    response = types.SimpleNamespace(status_code=403, headers={"X-Error-Code": "GatedRepo"}, request=None)
    gated = errors.GatedRepoError("403 Client Error.\n\nCannot access gated repo", response=response)
    self.assertIn("gated repo; accept its terms on the Hub and set HF_TOKEN", str(hub.error("o/n", gated, "reading")))
    self.assertNotIn("\n", str(hub.error("o/n", ValueError("first\nsecond"), "reading")))


class RangedReadTest(absltest.TestCase):
  """Reads through the Hub stand-in (a redirect to a storage host that answers ranges), as the converter makes them."""

  def setUp(self):
    super().setUp()
    import huggingface_hub.constants  # pylint: disable=g-import-not-at-top

    directory = self.create_tempdir().full_path
    self.data = os.urandom(3 << 20)
    with open(os.path.join(directory, "model.safetensors"), "wb") as f:
      f.write(self.data)
    with open(os.path.join(directory, "config.json"), "w") as f:
      f.write("{}")
    self.hub = self.enter_context(hub_stand_in.HubStandIn({"o/n": directory}))
    self.enter_context(mock.patch.multiple(
        huggingface_hub.constants, ENDPOINT=self.hub.url, HF_HUB_OFFLINE=False,
        HF_HUB_CACHE=self.create_tempdir().full_path,
        HUGGINGFACE_CO_URL_TEMPLATE=self.hub.url + "/{repo_id}/resolve/{revision}/{filename}"))
    defaults = hub.Settings()
    hub.configure(part_bytes=1 << 20, connections=4, initial_delay_s=0.01, max_delay_s=0.05)
    self.addCleanup(hub.configure, **{f: getattr(defaults, f) for f in ("part_bytes", "connections",
                                                                         "initial_delay_s", "max_delay_s")})
    hub.forget()
    self.addCleanup(hub.forget)
    self.weights = hub.path_of("o/n", hub_stand_in.COMMIT, "model.safetensors")

  def test_parts_in_parallel_through_faults_each_byte_once(self):
    self.hub.faults.extend([429, "drop", 503])
    start, stop = 100, (3 << 20) - 7
    self.assertEqual(bytes(hub.read_bytes(self.weights, start, stop)), self.data[start:stop])
    self.assertEqual(self.hub.faults_served, [429, "drop", 503])
    self.assertEqual((hub.stats().retries, hub.stats().bytes, self.hub.bytes_sent), (3, stop - start, stop - start))
    self.assertEqual(sorted(hub.stats().reasons), ["HTTP 429", "HTTP 503", "connection lost"])
    self.assertGreaterEqual(len(self.hub.ranges), 3)  # Three parts of 1 MiB, the dropped one resumed.
    self.assertEqual(self.hub.storage_authorizations, [])
    self.assertEqual(hub.size(self.weights), len(self.data))
    self.assertEqual(hub.resolve_commit("o/n", "main", "config.json"), hub_stand_in.COMMIT)

  def test_retries_run_out_naming_the_bytes(self):
    hub.configure(max_retries=2)
    self.addCleanup(hub.configure, max_retries=hub.Settings().max_retries)
    self.hub.faults.extend([503, 503, 503])
    with self.assertRaisesRegex(hub.HubReadError, r"bytes 0-8: HTTP 503, still after 2 retries"):
      hub.read_bytes(self.weights, 0, 8)

  def test_a_file_the_repo_lacks(self):
    missing = hub.path_of("o/n", hub_stand_in.COMMIT, "model-00002-of-00002.safetensors")
    self.assertFalse(hub.exists(missing))
    self.assertTrue(hub.exists(self.weights))
    self.assertIsNone(hub.local_copy(self.weights))  # Weights are read by ranges, never downloaded whole.
    config = hub.local_copy(hub.path_of("o/n", hub_stand_in.COMMIT, "config.json"))
    with open(config) as f:
      self.assertEqual(f.read(), "{}")


class _HttpError(Exception):

  def __init__(self, status: int, message: str = ""):
    super().__init__(f"{status} error")
    self.response = types.SimpleNamespace(status_code=status, headers={"X-Error-Message": message})


if __name__ == "__main__":
  absltest.main()
