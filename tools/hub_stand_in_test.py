"""The Hub stand-in answers huggingface_hub 2.4's own upload calls as the Hub does: repos and branches created
(409 when they exist), LFS objects sent whole or in parts and checked against their sha256, an object already
stored not asked for again, one commit per call refused when its parent moved (412) or the token is unknown (401).
And it serves downloads as the Hub does: a safetensors file redirected to a storage host that answers byte ranges
without a token (snapshot_download gets the same bytes), paced to a link's limits, answering the faults a test
queues, holding the read it names; a commit moves a branch while the old commit stays readable; gated and private
repos refuse a request without a read token."""

import errno
import hashlib
import os
import threading
import time
from unittest import mock

from absl.testing import absltest
import httpx2

from tools import hub_stand_in

REPO = "org/model"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def _huggingface_hub():
  """huggingface_hub, imported with what it reads at import: LFS transfers (the stand-in has no Xet), and online
  (the test suites set HF_HUB_OFFLINE; these tests talk to 127.0.0.1 only)."""
  os.environ["HF_HUB_DISABLE_XET"] = "1"
  os.environ.pop("HF_HUB_OFFLINE", None)
  import huggingface_hub  # pylint: disable=g-import-not-at-top
  import huggingface_hub.errors  # pylint: disable=g-import-not-at-top,unused-import
  return huggingface_hub


class HubStandInTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.repo_dir = self.create_tempdir().full_path
    self.files = {"config.json": b'{"model_type": "qwen3"}', SHARDS[0]: os.urandom(300_000),
                  SHARDS[1]: os.urandom(200_001)}
    for name, data in self.files.items():
      with open(os.path.join(self.repo_dir, name), "wb") as f:
        f.write(data)

  def resolve(self, client: httpx2.Client, hub: hub_stand_in.HubStandIn, name: str, revision: str = "main",
              **headers: str) -> httpx2.Response:
    return client.head(f"{hub.url}/{REPO}/resolve/{revision}/{name}", headers=headers, follow_redirects=False)

  def test_huggingface_hubs_upload_calls(self):
    huggingface_hub = _huggingface_hub()
    weights = os.path.join(self.create_tempdir().full_path, "model.safetensors")
    with open(weights, "wb") as f:
      f.write(os.urandom(3 << 20))
    with hub_stand_in.HubStandIn({}, tokens={"hf_write"}, multipart_bytes=1 << 20) as hub:
      api = huggingface_hub.HfApi(endpoint=hub.url, token="hf_write")
      api.create_repo("org/model", private=True)
      api.create_repo("org/model", exist_ok=True)  # The 409 answer names the repo's URL, as the Hub's does.
      api.create_branch("org/model", branch="dev")
      head = api.repo_info("org/model", revision="dev").sha
      weights_op = huggingface_hub.CommitOperationAdd(path_in_repo="model.safetensors", path_or_fileobj=weights)
      api.preupload_lfs_files("org/model", [weights_op], revision="dev")
      self.assertEqual(weights_op.path_or_fileobj, b"")  # Sent: huggingface_hub let go of its content.
      self.assertLen(hub.uploads, 3)  # In three parts of 1 MiB.
      api.create_commit("org/model", [weights_op, huggingface_hub.CommitOperationAdd(path_in_repo="config.json",
                                                                                     path_or_fileobj=b"{}")],
                        commit_message="m", revision="dev", parent_commit=head)
      with open(weights, "rb") as f:
        self.assertEqual(hub.files("org/model", "dev"), {"config.json": b"{}", "model.safetensors": f.read()})
      self.assertEqual(hub.files("org/model", "main"), {})
      self.assertTrue(hub.private["org/model"])

      again = huggingface_hub.CommitOperationAdd(path_in_repo="model.safetensors", path_or_fileobj=weights)
      api.preupload_lfs_files("org/model", [again], revision="dev")
      self.assertLen(hub.uploads, 3)  # Stored already: not sent again.
      with self.assertRaises(huggingface_hub.errors.HfHubHTTPError) as refused:
        api.create_commit("org/model", [again], commit_message="m", revision="dev", parent_commit=head)
      self.assertEqual(refused.exception.response.status_code, 412)
      with self.assertRaises(huggingface_hub.errors.HfHubHTTPError) as refused:
        huggingface_hub.HfApi(endpoint=hub.url, token="hf_other").create_repo("org/other")
      self.assertEqual(refused.exception.response.status_code, 401)
      self.assertLen(hub.commits, 1)

      # A repo's directory on another file system than the stand-in's objects (Bazel's sandbox): copied there.
      cross_device = OSError(errno.EXDEV, "Invalid cross-device link")
      with mock.patch.object(hub_stand_in.os, "link", side_effect=cross_device):
        head = api.repo_info("org/model", revision="dev").sha
        api.create_commit("org/model", [huggingface_hub.CommitOperationAdd(path_in_repo="copy.safetensors",
                                                                           path_or_fileobj=weights)],
                          commit_message="m", revision="dev", parent_commit=head)
      with open(weights, "rb") as f:
        sent = f.read()
      self.assertEqual(hub.files("org/model", "dev")["copy.safetensors"], sent)
      # The pushed weights are served as the Hub serves them: by a redirect to the storage host.
      answer = httpx2.get(f"{hub.url}/org/model/resolve/dev/copy.safetensors", follow_redirects=True,
                          headers={"Authorization": "Bearer hf_write"})
      self.assertEqual((answer.content, answer.history[0].status_code), (sent, 302))

  def test_a_safetensors_file_is_redirected_to_a_storage_host_that_reads_ranges(self):
    data, digest = self.files[SHARDS[0]], hashlib.sha256(self.files[SHARDS[0]]).hexdigest()
    with hub_stand_in.HubStandIn({REPO: self.repo_dir}) as hub, httpx2.Client() as client:
      redirect = self.resolve(client, hub, SHARDS[0])
      self.assertEqual(redirect.status_code, 302)
      location = redirect.headers["Location"]
      self.assertTrue(location.startswith(f"{hub.storage_url}/{digest}/{SHARDS[0]}?expires="), location)
      self.assertNotEqual(hub.storage_url, hub.url)
      self.assertEqual(redirect.headers["X-Linked-Etag"], f'"{digest}"')
      self.assertEqual(redirect.headers["X-Linked-Size"], str(len(data)))
      self.assertEqual(redirect.headers["X-Repo-Commit"], hub_stand_in.COMMIT)
      self.assertIn("ETag", redirect.headers)
      self.assertEqual(redirect.headers["Content-Length"], str(len(client.get(redirect.url).content)))

      ranged = client.get(location, headers={"Range": "bytes=1000-1999"})
      self.assertEqual(ranged.status_code, 206)
      self.assertEqual(ranged.headers["Content-Range"], f"bytes 1000-1999/{len(data)}")
      self.assertEqual(ranged.content, data[1000:2000])
      self.assertEqual(client.get(location, headers={"Range": "bytes=-10"}).content, data[-10:])
      self.assertEqual(client.get(location, headers={"Range": f"bytes={len(data) - 5}-"}).content, data[-5:])
      whole = client.get(location)
      self.assertEqual((whole.status_code, whole.content), (200, data))
      unsatisfiable = client.get(location, headers={"Range": f"bytes={len(data)}-{len(data) + 10}"})
      self.assertEqual(unsatisfiable.status_code, 416)
      self.assertEqual(unsatisfiable.headers["Content-Range"], f"bytes */{len(data)}")

      config = client.get(f"{hub.url}/{REPO}/resolve/main/config.json")  # Not LFS: from the main host.
      self.assertEqual((config.status_code, config.content), (200, self.files["config.json"]))
      self.assertEqual(hub.ranges, [(SHARDS[0], 1000, 2000), (SHARDS[0], len(data) - 10, len(data)),
                                    (SHARDS[0], len(data) - 5, len(data)), (SHARDS[0], 0, len(data))])
      self.assertEqual(hub.bytes_sent, 1000 + 10 + 5 + len(data))
      self.assertEqual(hub.resolves, [("HEAD", SHARDS[0], "main"), ("GET", SHARDS[0], "main"),
                                      ("GET", "config.json", "main")])
      self.assertEqual(hub.requested, [SHARDS[0], "config.json"])  # Whole files only.
      client.get(location, headers={"Authorization": "Bearer leaked"})
      self.assertEqual(hub.storage_authorizations, ["Bearer leaked"])

  def test_snapshot_download_through_the_redirect(self):
    huggingface_hub = _huggingface_hub()
    cache = self.create_tempdir().full_path
    with hub_stand_in.HubStandIn({REPO: self.repo_dir}, gated={REPO}, read_tokens={"hf_read"}) as hub:
      snapshot = huggingface_hub.snapshot_download(REPO, cache_dir=cache, endpoint=hub.url, token="hf_read",
                                                   allow_patterns=["*.safetensors", "config.json"])
      self.assertEqual(sorted(os.listdir(snapshot)), sorted(self.files))
      for name, data in self.files.items():
        with open(os.path.join(snapshot, name), "rb") as f:
          self.assertEqual(f.read(), data, name)
      self.assertEqual(sorted(hub.ranges), sorted((n, 0, len(self.files[n])) for n in SHARDS))
      self.assertIn("Bearer hf_read", hub.authorizations)
      info = huggingface_hub.HfApi(endpoint=hub.url, token="hf_read").model_info(REPO, files_metadata=True)
      self.assertEqual({s.rfilename: (s.size, s.lfs.sha256) for s in info.siblings if s.lfs},
                       {n: (len(self.files[n]), hashlib.sha256(self.files[n]).hexdigest()) for n in SHARDS})
      self.assertEqual(hub.storage_authorizations, [])  # The token never left the Hub.

  def test_link_limits_pace_the_storage_hosts_bodies(self):
    with open(os.path.join(self.repo_dir, "big.safetensors"), "wb") as f:
      f.write(os.urandom(2_000_000))

    def read(hub: hub_stand_in.HubStandIn, count: int) -> float:
      """Seconds `count` connections take to read the 2 MB file at once."""
      with httpx2.Client() as client:
        location = self.resolve(client, hub, "big.safetensors").headers["Location"]
      start = time.monotonic()
      threads = [threading.Thread(target=httpx2.get, args=(location,)) for _ in range(count)]
      for thread in threads:
        thread.start()
      for thread in threads:
        thread.join()
      self.assertEqual(hub.bytes_sent, count * 2_000_000)
      return time.monotonic() - start

    link = hub_stand_in.LinkLimits(per_connection_bytes_per_s=4e6, latency_s=0.2)
    with hub_stand_in.HubStandIn({REPO: self.repo_dir}, link=link) as hub:
      self.assertGreaterEqual(read(hub, 1), 0.6)  # 0.2 s of latency, then 2 MB at 4 MB/s.
      start = time.monotonic()
      httpx2.get(f"{hub.storage_url}/absent/big.safetensors")
      self.assertGreaterEqual(time.monotonic() - start, 0.2)  # Every answer waits the latency.
    link = hub_stand_in.LinkLimits(aggregate_bytes_per_s=4e6)
    with hub_stand_in.HubStandIn({REPO: self.repo_dir}, link=link) as hub:
      self.assertGreaterEqual(read(hub, 2), 0.9)  # 2 + 2 MB through one 4 MB/s.

  def test_a_queued_fault_is_served_once_then_the_read_succeeds(self):
    data = self.files[SHARDS[1]]
    with hub_stand_in.HubStandIn({REPO: self.repo_dir}) as hub, httpx2.Client() as client:
      location = self.resolve(client, hub, SHARDS[1]).headers["Location"]
      hub.faults.extend([429, 503, "drop"])
      ranged = {"Range": "bytes=0-99999"}
      limited = client.get(location, headers=ranged)
      self.assertEqual((limited.status_code, limited.headers["Retry-After"]), (429, "1"))
      self.assertEqual(client.get(location, headers=ranged).status_code, 503)
      with self.assertRaises(httpx2.RemoteProtocolError):  # The headers promised more than came.
        client.get(location, headers=ranged)
      self.assertEqual(client.get(location, headers=ranged).content, data[:100_000])
      self.assertEqual((hub.faults, hub.faults_served), ([], [429, 503, "drop"]))
      self.assertEqual(hub.ranges, [(SHARDS[1], 0, 50_000), (SHARDS[1], 0, 100_000)])  # What the link carried.

  def test_a_commit_moves_the_branch_and_the_old_commit_stays_readable(self):
    old, new = self.files[SHARDS[0]], os.urandom(1000)
    with hub_stand_in.HubStandIn({REPO: self.repo_dir}) as hub, httpx2.Client(follow_redirects=True) as client:
      old_location = self.resolve(client, hub, SHARDS[0]).headers["Location"]
      commit = hub.commit(REPO, {SHARDS[0]: new, "added.json": b"{}"})
      self.assertNotEqual(commit, hub_stand_in.COMMIT)
      main = self.resolve(client, hub, SHARDS[0])
      self.assertEqual(main.headers["X-Repo-Commit"], commit)
      self.assertEqual(main.headers["X-Linked-Etag"], f'"{hashlib.sha256(new).hexdigest()}"')
      self.assertEqual(client.get(f"{hub.url}/{REPO}/resolve/main/{SHARDS[0]}").content, new)
      self.assertEqual(client.get(f"{hub.url}/{REPO}/resolve/{hub_stand_in.COMMIT}/{SHARDS[0]}").content, old)
      self.assertEqual(client.get(old_location).content, old)  # A URL handed out before the commit.
      self.assertEqual(client.get(f"{hub.url}/{REPO}/resolve/main/{SHARDS[1]}").content, self.files[SHARDS[1]])
      self.assertEqual(client.get(f"{hub.url}/{REPO}/resolve/{hub_stand_in.COMMIT}/added.json").status_code, 404)
      self.assertEqual(client.get(f"{hub.url}/api/models/{REPO}/revision/main").json()["sha"], commit)
      self.assertEqual(hub.files(REPO)["added.json"], b"{}")
      self.assertNotEqual(hub.commit(REPO, {"added.json": b"[]"}), commit)
      self.assertEqual(client.get(f"{hub.url}/{REPO}/resolve/{commit}/added.json").content, b"{}")
      self.assertEqual(client.get(f"{hub.url}/{REPO}/resolve/main/added.json").content, b"[]")
    with open(os.path.join(self.repo_dir, SHARDS[0]), "rb") as f:
      self.assertEqual(f.read(), old)  # The caller's directory is left as it was.

  def test_gated_and_private_repos_need_a_read_token(self):
    huggingface_hub = _huggingface_hub()
    repos = {"org/gated": self.repo_dir, "org/private": self.repo_dir, "org/public": self.repo_dir}
    with hub_stand_in.HubStandIn(repos, gated={"org/gated"}, private={"org/private"}, read_tokens={"hf_read"},
                                 tokens={"hf_write"}) as hub, httpx2.Client() as client:
      def head(repo: str, token: str | None = None) -> httpx2.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return client.head(f"{hub.url}/{repo}/resolve/main/{SHARDS[0]}", headers=headers)

      gated = head("org/gated")
      self.assertEqual((gated.status_code, gated.headers["X-Error-Code"]), (403, "GatedRepo"))
      self.assertIn("Access to model org/gated is restricted", gated.headers["X-Error-Message"])
      private = head("org/private")
      self.assertEqual((private.status_code, private.headers["X-Error-Code"]), (401, "RepoNotFound"))
      self.assertEqual(head("org/private", "hf_write").status_code, 401)  # Writing is not reading.
      for repo in repos:
        self.assertEqual(head(repo, "hf_read").status_code, 302, repo)
      self.assertEqual(head("org/public").status_code, 302)
      unknown = head("org/public", "hf_wrong")
      self.assertEqual((unknown.status_code, unknown.headers["X-Error-Message"]), (401, hub_stand_in.BAD_TOKEN))
      self.assertEqual(client.get(f"{hub.url}/api/models/org/private").status_code, 401)

      cache = self.create_tempdir().full_path
      with self.assertRaises(huggingface_hub.errors.GatedRepoError):
        huggingface_hub.hf_hub_download("org/gated", "config.json", cache_dir=cache, endpoint=hub.url, token=False)
      with self.assertRaises(huggingface_hub.errors.RepositoryNotFoundError):
        huggingface_hub.hf_hub_download("org/private", "config.json", cache_dir=cache, endpoint=hub.url,
                                        token=False)

  def test_a_ranged_read_held_until_released(self):
    with hub_stand_in.HubStandIn({REPO: self.repo_dir}, hold_range=2) as hub, httpx2.Client() as client:
      numbers = []
      hub.on_range = numbers.append
      location = self.resolve(client, hub, SHARDS[0]).headers["Location"]
      ranged = {"Range": "bytes=0-9"}
      self.assertEqual(client.get(location, headers=ranged).status_code, 206)
      answers = []
      held = threading.Thread(target=lambda: answers.append(httpx2.get(location, headers=ranged)))
      held.start()
      self.assertTrue(hub.holding_range.wait(10))
      time.sleep(0.1)
      self.assertEqual(answers, [])
      hub.release()
      held.join(10)
      self.assertEqual(answers[0].content, self.files[SHARDS[0]][:10])
      self.assertEqual(numbers, [1, 2])


if __name__ == "__main__":
  absltest.main()
