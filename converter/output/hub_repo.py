"""An output on the Hugging Face Hub (`--output_dir=hf://ORG/NAME`, or `hf://ORG/NAME@BRANCH`): the way back's
HF checkpoint pushed in one commit through huggingface_hub's own commit API.

Each shard is written to a local staging directory, uploaded as soon as it is complete (`preupload_lfs_files`:
Xet or LFS, whichever huggingface_hub uses, large files in parts as the Hub asks) while the next one is written,
and deleted: the disk holds at most the shard being written and the one being sent, never the whole model.
The index, config.json and serving files follow, and one commit makes them all the repo's files, so a
failed conversion leaves the repo as it was. Uploaded files the commit never named stay in the Hub's storage,
addressed by their content: a re-run after an interruption sends only the shards that were not uploaded yet.

The repo is created when missing (`private` from --hub_private); a branch named in the path is created from the
default branch when missing. A repo that already holds a checkpoint (weights or config.json) is refused unless
--overwrite, which replaces its weights in the same commit (files that are not weights, such as a README, are
kept). The commit names the head it started from, so a commit landing on the branch meanwhile fails it instead
of being mixed in. HF_TOKEN and HF_ENDPOINT are huggingface_hub's own.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import threading
from typing import Any, Sequence

from absl import logging

from converter.errors import ConversionError
from converter.storage import hub, scratch

_URL = re.compile(r"hf://([A-Za-z0-9][\w.-]*/[\w.-]+)(?:@([^/\s]+))?/?")
# What makes a repo's files a checkpoint, replaced as a whole by --overwrite.
_CHECKPOINT_FILE = re.compile(r"(.*\.safetensors|.*\.safetensors\.index\.json|config\.json|adapter_config\.json"
                              r"|.*\.bin|.*\.bin\.index\.json)")


def parse(path: str) -> tuple[str, str | None]:
  """(repo id, branch or None for the default branch) of `hf://ORG/NAME[@BRANCH]`."""
  match = _URL.fullmatch(path)
  if not match:
    raise ConversionError(f"{path}: expected hf://ORG/NAME or hf://ORG/NAME@BRANCH (a Hub repo, written at the"
                          " root of that branch)")
  return match.group(1), match.group(2)


class _NoLock:
  """The Hub takes commits, not locks: a second writer's commit is refused by the head it names (see `publish`)."""

  lost = None

  def acquire(self) -> None:
    pass

  def release(self) -> None:
    pass


class HubRepo:
  """A Hub repo (and branch) as the output of the way back to HuggingFace."""

  MAX_PENDING_UPLOADS = 1  # Shards sent while the next is written; more would hold more of the model on disk.

  def __init__(self, path: str, *, private: bool = False, staging_parent: str | None = None):
    self.path = path
    self.repo_id, self.branch = parse(path)
    self._private = private
    self._staging_parent = staging_parent
    self._api: Any = None
    self._parent_commit: str | None = None
    self._stale: list[str] = []
    self._additions: list[Any] = []
    self._uploads: list[concurrent.futures.Future] = []
    self._pool: concurrent.futures.ThreadPoolExecutor | None = None
    self._staging: scratch.ScratchDirectory | None = None

  @property
  def _where(self) -> str:
    return f"{self.path} ({'branch ' + self.branch if self.branch else 'default branch'})"

  def _call(self, doing: str, fn, *args, **kwargs):
    from huggingface_hub import errors  # pylint: disable=g-import-not-at-top

    try:
      return fn(*args, **kwargs)
    except (errors.HfHubHTTPError, OSError, ValueError) as e:
      raise hub.error(self._where, e, doing, writing=True) from e

  # What a MaxText checkpoint needs of a destination: the Hub holds HF checkpoints only.
  def _maxtext_refused(self, *args, **kwargs):
    del args, kwargs
    raise ConversionError(f"{self.path}: a MaxText checkpoint cannot be written to the Hub (Orbax writes files in"
                          " place); write it to a disk or gs://, the way back to HuggingFace (--direction="
                          "to_huggingface) writes to hf://")

  journal = unfinished_steps = has_committed_step = check_writable = writing = _maxtext_refused

  def lock(self, lock_path: str, lease_s: float, on_lost: threading.Event | None) -> _NoLock:
    del lock_path, lease_s, on_lost
    return _NoLock()

  def stage(self, overwrite: bool, shared: bool) -> str:
    """Creates the repo and branch when missing, notes the head the commit will name and the checkpoint files an
    --overwrite replaces; returns a local staging directory, in TMPDIR, that a killed push leaves for the next
    run to remove (converter/storage/scratch.py)."""
    if shared:
      raise ConversionError(f"{self.path}: the way back to the Hub runs in one process (its single commit names"
                            " every shard); run it on one host, or write to gs:// from several and upload that")
    self._api = hub.api()
    self._call("creating the repo", self._api.create_repo, self.repo_id, private=self._private, exist_ok=True)
    if self.branch:
      self._call(f"creating branch {self.branch}", self._api.create_branch, self.repo_id, branch=self.branch,
                 exist_ok=True)
    info = self._call("reading the repo", self._api.repo_info, self.repo_id, revision=self.branch)
    self._parent_commit = info.sha
    existing = sorted(s.rfilename for s in (info.siblings or []) if _CHECKPOINT_FILE.fullmatch(s.rfilename))
    if existing and not overwrite:
      shown = ", ".join(existing[:4]) + (f" and {len(existing) - 4} more" if len(existing) > 4 else "")
      raise ConversionError(f"{self._where}: the repo already holds a checkpoint ({shown}); pass --overwrite to"
                            " replace its weights in one commit (its other files are kept)")
    self._stale = existing
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hf2maxtext-upload")
    self._staging = scratch.claim("hub", self._staging_parent)
    return self._staging.path

  def shared_staging(self) -> str:
    raise ConversionError(f"{self.path}: the way back to the Hub runs in one process")

  def finished_file(self, path: str) -> None:
    """Uploads the complete file at `path` in the background and deletes it once sent; waits while an earlier
    upload is still under way, so the disk holds at most two shards."""
    from huggingface_hub import CommitOperationAdd  # pylint: disable=g-import-not-at-top

    while len([u for u in self._uploads if not u.done()]) >= self.MAX_PENDING_UPLOADS:
      concurrent.futures.wait(self._uploads, return_when=concurrent.futures.FIRST_COMPLETED)
    for upload in self._uploads:
      if upload.done():
        upload.result()  # Raises an earlier upload's error now rather than after the whole model.
    addition = CommitOperationAdd(path_in_repo=os.path.basename(path), path_or_fileobj=path)
    self._additions.append(addition)
    self._uploads.append(self._pool.submit(self._upload, addition, path))

  def _upload(self, addition: Any, path: str) -> None:
    logging.info("uploading %s to %s", addition.path_in_repo, self._where)
    self._call(f"uploading {addition.path_in_repo}", self._api.preupload_lfs_files, self.repo_id, [addition],
               revision=self.branch, free_memory=True)
    if addition.path_or_fileobj == b"":  # Sent to the Hub's storage (a small file goes in the commit instead).
      os.remove(path)

  def publish(self, staging: str, unsynced: Sequence[str]) -> None:
    """Sends the rest of `staging` (the index, config.json, serving files) and commits everything at once."""
    del unsynced
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete  # pylint: disable=g-import-not-at-top

    for upload in concurrent.futures.as_completed(self._uploads):
      upload.result()
    self._pool.shutdown()
    uploaded = {a.path_in_repo for a in self._additions}
    for name in sorted(os.listdir(staging)):
      if name not in uploaded:
        self._additions.append(CommitOperationAdd(path_in_repo=name, path_or_fileobj=os.path.join(staging, name)))
    names = {a.path_in_repo for a in self._additions}
    deletions = [CommitOperationDelete(path_in_repo=name) for name in self._stale if name not in names]
    self._call("committing", self._api.create_commit, self.repo_id, [*self._additions, *deletions],
               commit_message="Upload the checkpoint written back by hf2maxtext", revision=self.branch,
               parent_commit=self._parent_commit)
    self._release_staging()

  def discard(self, staging: str) -> None:
    """A failed conversion: nothing committed; pending uploads cancelled (those sent stay in the Hub's storage,
    unreferenced, for a re-run to skip)."""
    del staging  # The directory `stage` claimed.
    if self._pool is not None:
      for upload in self._uploads:
        upload.cancel()
      with contextlib.suppress(Exception):
        self._pool.shutdown(wait=True)
    self._release_staging()

  def _release_staging(self) -> None:
    if self._staging is not None:
      self._staging.release()

