"""The Hub's paths, repo ids and errors in the user's words (reads through a stand-in: integration_tests/hub_test.py
and tools/hub_stand_in_test.py)."""

import os
import types

from absl.testing import absltest

from converter.errors import ConversionError
from converter.storage import hub


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


class _HttpError(Exception):

  def __init__(self, status: int, message: str = ""):
    super().__init__(f"{status} error")
    self.response = types.SimpleNamespace(status_code=status, headers={"X-Error-Message": message})


if __name__ == "__main__":
  absltest.main()
