"""The Hub stand-in answers huggingface_hub 2.4's own upload calls as the Hub does: repos and branches created
(409 when they exist), LFS objects sent whole or in parts and checked against their sha256, an object already
stored not asked for again, one commit per call refused when its parent moved (412) or the token is unknown (401)."""

import errno
import os
from unittest import mock

from absl.testing import absltest

from tools import hub_stand_in


class HubStandInTest(absltest.TestCase):

  def test_huggingface_hubs_upload_calls(self):
    # Read when huggingface_hub is imported, so before the import below: LFS transfers (the stand-in has no Xet),
    # and online (the test suites set HF_HUB_OFFLINE; this test talks to 127.0.0.1 only).
    os.environ["HF_HUB_DISABLE_XET"] = "1"
    os.environ.pop("HF_HUB_OFFLINE", None)
    from huggingface_hub import CommitOperationAdd, HfApi, errors  # pylint: disable=g-import-not-at-top

    weights = os.path.join(self.create_tempdir().full_path, "model.safetensors")
    with open(weights, "wb") as f:
      f.write(os.urandom(3 << 20))
    with hub_stand_in.HubStandIn({}, tokens={"hf_write"}, multipart_bytes=1 << 20) as hub:
      api = HfApi(endpoint=hub.url, token="hf_write")
      api.create_repo("org/model", private=True)
      api.create_repo("org/model", exist_ok=True)  # The 409 answer names the repo's URL, as the Hub's does.
      api.create_branch("org/model", branch="dev")
      head = api.repo_info("org/model", revision="dev").sha
      weights_op = CommitOperationAdd(path_in_repo="model.safetensors", path_or_fileobj=weights)
      api.preupload_lfs_files("org/model", [weights_op], revision="dev")
      self.assertEqual(weights_op.path_or_fileobj, b"")  # Sent: huggingface_hub let go of its content.
      self.assertLen(hub.uploads, 3)  # In three parts of 1 MiB.
      api.create_commit("org/model", [weights_op, CommitOperationAdd(path_in_repo="config.json",
                                                                     path_or_fileobj=b"{}")],
                        commit_message="m", revision="dev", parent_commit=head)
      with open(weights, "rb") as f:
        self.assertEqual(hub.files("org/model", "dev"), {"config.json": b"{}", "model.safetensors": f.read()})
      self.assertEqual(hub.files("org/model", "main"), {})
      self.assertTrue(hub.private["org/model"])

      again = CommitOperationAdd(path_in_repo="model.safetensors", path_or_fileobj=weights)
      api.preupload_lfs_files("org/model", [again], revision="dev")
      self.assertLen(hub.uploads, 3)  # Stored already: not sent again.
      with self.assertRaises(errors.HfHubHTTPError) as refused:
        api.create_commit("org/model", [again], commit_message="m", revision="dev", parent_commit=head)
      self.assertEqual(refused.exception.response.status_code, 412)
      with self.assertRaises(errors.HfHubHTTPError) as refused:
        HfApi(endpoint=hub.url, token="hf_other").create_repo("org/other")
      self.assertEqual(refused.exception.response.status_code, 401)
      self.assertLen(hub.commits, 1)

      # A repo's directory on another file system than the stand-in's objects (Bazel's sandbox): copied there.
      cross_device = OSError(errno.EXDEV, "Invalid cross-device link")
      with mock.patch.object(hub_stand_in.os, "link", side_effect=cross_device):
        head = api.repo_info("org/model", revision="dev").sha
        api.create_commit("org/model", [CommitOperationAdd(path_in_repo="copy.safetensors", path_or_fileobj=weights)],
                          commit_message="m", revision="dev", parent_commit=head)
      with open(weights, "rb") as f:
        self.assertEqual(hub.files("org/model", "dev")["copy.safetensors"], f.read())


if __name__ == "__main__":
  absltest.main()
