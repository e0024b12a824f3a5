"""The Hub output's path syntax and its streaming: each finished shard sent and
deleted while the next is written, one commit naming the head it started from (a recording stand-in for
huggingface_hub's HfApi; the protocol itself is integration_tests/hub_test.py's, against the Hub stand-in)."""

import os
import threading
import types

from absl.testing import absltest

from converter.errors import ConversionError
from converter.output import hub_repo


class ParseTest(absltest.TestCase):

  def test_repo_and_branch(self):
    self.assertEqual(hub_repo.parse("hf://org/name"), ("org/name", None))
    self.assertEqual(hub_repo.parse("hf://org/name@dev"), ("org/name", "dev"))
    self.assertEqual(hub_repo.parse("hf://org/Name-1.5B/"), ("org/Name-1.5B", None))
    for bad in ("hf://name", "hf://org/name/sub", "hf://org/name@"):
      with self.assertRaisesRegex(ConversionError, "expected hf://ORG/NAME"):
        hub_repo.parse(bad)


class _RecordingApi:
  """HfApi as the Hub output calls it; a preupload frees LFS files' content as huggingface_hub does."""

  def __init__(self, siblings=(), regular=()):
    self.siblings = siblings
    self.regular = set(regular)
    self.uploaded: list[str] = []
    self.commit = None
    self.release = threading.Event()
    self.release.set()

  def create_repo(self, repo_id, private, exist_ok):
    self.created = (repo_id, private, exist_ok)

  def create_branch(self, repo_id, branch, exist_ok):
    self.branch = branch

  def repo_info(self, repo_id, revision):
    return types.SimpleNamespace(sha="head0", siblings=[types.SimpleNamespace(rfilename=n) for n in self.siblings])

  def preupload_lfs_files(self, repo_id, additions, revision, free_memory):
    self.release.wait(10)
    for addition in additions:
      self.uploaded.append(addition.path_in_repo)
      if addition.path_in_repo not in self.regular:
        addition.path_or_fileobj = b""

  def create_commit(self, repo_id, operations, commit_message, revision, parent_commit):
    self.commit = (operations, revision, parent_commit)


class StreamingTest(absltest.TestCase):

  def _repo(self, api, path="hf://org/name@dev", overwrite=False):
    repo = hub_repo.HubRepo(path, private=True, staging_parent=self.create_tempdir().full_path)
    import huggingface_hub  # pylint: disable=g-import-not-at-top

    original = huggingface_hub.HfApi
    huggingface_hub.HfApi = lambda: api
    try:
      staging = repo.stage(overwrite=overwrite, shared=False)
    finally:
      huggingface_hub.HfApi = original
    return repo, staging

  def _write(self, staging, name, data=b"x" * 16):
    path = os.path.join(staging, name)
    with open(path, "wb") as f:
      f.write(data)
    return path

  def test_shards_sent_and_deleted_then_one_commit_from_the_head_it_started_on(self):
    api = _RecordingApi(siblings=["README.md", "model.safetensors"], regular={"tiny.safetensors"})
    repo, staging = self._repo(api, overwrite=True)
    self.assertEqual((api.created, api.branch), (("org/name", True, True), "dev"))
    first = self._write(staging, "model-00001-of-00002.safetensors")
    repo.finished_file(first)
    second = self._write(staging, "model-00002-of-00002.safetensors")
    repo.finished_file(second)  # Waits for the first upload: at most one is pending.
    tiny = self._write(staging, "tiny.safetensors")
    repo.finished_file(tiny)
    self._write(staging, "config.json", b"{}")
    self.assertEqual(sorted(os.listdir(staging)), ["config.json", "tiny.safetensors"])  # Sent shards deleted.
    repo.publish(staging, ["config.json"])
    self.assertFalse(os.path.exists(staging))
    operations, revision, parent = api.commit
    self.assertEqual((revision, parent), ("dev", "head0"))
    added = [op.path_in_repo for op in operations if type(op).__name__ == "CommitOperationAdd"]
    deleted = [op.path_in_repo for op in operations if type(op).__name__ == "CommitOperationDelete"]
    self.assertEqual(added, ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                             "tiny.safetensors", "config.json"])
    self.assertEqual(deleted, ["model.safetensors"])  # README.md is not a checkpoint file: kept.

  def test_a_sent_shard_leaves_the_disk_before_the_one_after_next_is_handed_over(self):
    api = _RecordingApi()
    repo, staging = self._repo(api)
    api.release.clear()  # The first upload hangs.
    first = self._write(staging, "a.safetensors")
    repo.finished_file(first)
    second = self._write(staging, "b.safetensors")
    handed = threading.Thread(target=repo.finished_file, args=(second,))
    handed.start()
    handed.join(0.3)
    self.assertTrue(handed.is_alive())  # Blocked behind the first upload: the writer stops, the disk holds two.
    api.release.set()
    handed.join(10)
    self.assertFalse(os.path.exists(first))
    repo.discard(staging)
    self.assertFalse(os.path.exists(staging))

  def test_a_repo_holding_a_checkpoint_is_refused_without_overwrite(self):
    api = _RecordingApi(siblings=["config.json", "model-00001-of-00002.safetensors", "README.md"])
    with self.assertRaisesRegex(ConversionError, r"hf://org/name \(default branch\): the repo already holds a"
                                r" checkpoint \(config.json, model-00001-of-00002.safetensors\); pass --overwrite"):
      self._repo(api, "hf://org/name")

  def test_several_processes_are_refused(self):
    repo = hub_repo.HubRepo("hf://org/name")
    with self.assertRaisesRegex(ConversionError, "runs in one process"):
      repo.stage(overwrite=False, shared=True)


if __name__ == "__main__":
  absltest.main()
