"""When --hf_model_path is a Hub repo id (downloads and the HF cache: integration_tests/hub_test.py)."""

import os

from absl.testing import absltest

from converter import hub


class RepoIdTest(absltest.TestCase):

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


if __name__ == "__main__":
  absltest.main()
