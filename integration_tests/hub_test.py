"""`--hf_model_path=ORG/NAME`: through a local stand-in that serves as the Hub does (a redirect to a storage host
answering range requests, faults, a commit landing mid-run, gated and private repos), straight into a bucket and
resumed there, with --hub_download_first, and offline from a cache laid out as huggingface_hub lays it out; the
result equals converting the same files from a local directory. And
`--output_dir=hf://ORG/NAME[@BRANCH]`, the way back pushed through the stand-in's upload endpoints (LFS, as
huggingface_hub sends with Xet off): its files equal the local way back's, an interrupted push sends only what is
missing when run again, and a refused token or a repo holding another checkpoint is said and changes nothing."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import threading
import time

from absl.testing import absltest

from integration_tests import fixtures, harness
from tools import gcs_emulator, hub_stand_in

harness.start_jax()

from converter.checkpoint_format.record import ConversionRecord  # pylint: disable=g-import-not-at-top
from tools import checkpoint_io  # pylint: disable=g-import-not-at-top

REPO = "tiny-org/tiny-moe"
_BUDGET = 1 << 20  # --max_inflight_bytes of the interrupted run: what it may have read and not written.
_DEAD_ENDPOINT = "http://127.0.0.1:9"  # Nothing listens there: a request would fail at once.


class HubTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = fixtures.write_moe("hub-hf-", fixtures.SMALL_MOE, max_shard_bytes=2 << 20)
    cls.shards = sorted(n for n in os.listdir(cls.model) if n.endswith(".safetensors"))
    cls.needed = sum(os.path.getsize(os.path.join(cls.model, shard)) for shard in cls.shards)  # Every byte is read.
    # What a real repo also holds, and a conversion must not fetch.
    for extra in ("tokenizer.json", "pytorch_model.bin"):
      with open(os.path.join(cls.model, extra), "wb") as f:
        f.write(os.urandom(1 << 16))
    with open(os.path.join(cls.model, "README.md"), "w") as f:
      f.write("---\nlicense: apache-2.0\n---\n# A model card, copied by the way back and pushed with it\n")
    cls.reference = cls.convert(cls.model)

  @classmethod
  def convert(cls, model: str, *flags: str, env: dict[str, str] | None = None, check: bool = True,
              out: str | None = None, both: bool = False) -> str | subprocess.CompletedProcess:
    """The output directory (with `both`, and the run; without `check`, the run alone)."""
    out = out or os.path.join(harness.scratch_dir("hub-out-"), "out")
    child_env = harness.converter_env(**(env or {}))
    if env is not None and "HF_HUB_OFFLINE" not in env:
      child_env.pop("HF_HUB_OFFLINE", None)  # The test suites set it; these tests choose.
    result = subprocess.run(harness.converter_command(f"--hf_model_path={model}", f"--output_dir={out}",
                                                      "--simulated_cpu_devices_count=1", "--noprogress", *flags),
                            env=child_env, capture_output=True, text=True, timeout=600)
    if not check:
      return result
    if result.returncode != 0:
      raise AssertionError(f"converting {model} failed:\n{result.stderr[-3000:]}")
    return (out, result) if both else out

  def assert_read_by_ranges(self, hub: hub_stand_in.HubStandIn, cache: str, scratch: str) -> None:
    """The weights came by ranged reads of the storage host, each byte once; only the config and the index reached
    the disk; the token stayed with the Hub."""
    self.assertEqual(sorted(hub.requested), ["config.json", "model.safetensors.index.json"])
    self.assertEqual(hub.storage_authorizations, [])
    self.assertLessEqual(hub.bytes_sent, 1.02 * self.needed)
    for shard in self.shards:
      spans = sorted((start, stop) for name, start, stop in hub.ranges if name == shard)
      self.assertTrue(spans, shard)
      for (_, stop), (start, _) in zip(spans, spans[1:]):
        self.assertLessEqual(stop, start, f"{shard}: bytes fetched twice")
    self.assert_only_configs_on_disk(cache, scratch)

  def assert_only_configs_on_disk(self, cache: str, scratch: str) -> None:
    """The HF cache holds the config and the index, nothing of the weights; TMPDIR nothing."""
    stored = [os.path.join(d, n) for d, _, names in os.walk(cache) for n in names]
    self.assertEqual(sorted(os.path.basename(p) for p in stored if "/snapshots/" in p),
                     ["config.json", "model.safetensors.index.json"])
    self.assertLess(max(os.path.getsize(p) for p in stored), 1 << 20)
    self.assertEqual(os.listdir(scratch), [])

  def assert_same_as_local(self, out: str) -> None:
    diffs = checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(os.path.join(out, "0", "items")),
                                              checkpoint_io.restore_v0(os.path.join(self.reference, "0", "items")))
    self.assertEqual(diffs, [])

  def error_line(self, result: subprocess.CompletedProcess) -> str:
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    self.assertLen(lines, 1, result.stderr[-2000:])
    self.assertNotIn("Traceback", result.stderr)
    return lines[0]

  def way_back(self, output_dir: str, *flags: str, env: dict[str, str] | None = None,
               check: bool = True) -> subprocess.CompletedProcess:
    """The way back of the reference conversion in 1 MB shards (several, each sent on its own)."""
    child_env = harness.converter_env(HF_HUB_DISABLE_XET="1", **(env or {}))
    child_env.pop("HF_HUB_OFFLINE", None)
    result = subprocess.run(harness.converter_command(
        "--direction=to_huggingface", f"--checkpoint_path={os.path.join(self.reference, '0', 'items')}",
        f"--output_dir={output_dir}", "--max_shard_size=1MB", "--noprogress", *flags),
        env=child_env, capture_output=True, text=True, timeout=600)
    if check:
      self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    return result

  def local_way_back(self) -> dict[str, bytes]:
    """The files the way back writes to a local directory (written once)."""
    if not hasattr(type(self), "_local_files"):
      back = os.path.join(harness.scratch_dir("hub-local-back-"), "hf")
      self.way_back(back)
      files = {}
      for name in sorted(os.listdir(back)):
        with open(os.path.join(back, name), "rb") as f:
          files[name] = f.read()
      type(self)._local_files = files
    return type(self)._local_files

  def assert_same_files(self, files: dict[str, bytes], expected: dict[str, bytes]) -> None:
    digest = lambda tree: {name: hashlib.sha256(data).hexdigest() for name, data in tree.items()}
    self.assertEqual(digest(files), digest(expected))

  def test_the_way_back_pushed_in_one_commit_converts_as_the_original(self):
    local = self.local_way_back()
    shards = [n for n in local if n.endswith(".safetensors")]
    self.assertGreater(len(shards), 2)
    cache = harness.scratch_dir("hub-cache-")
    with hub_stand_in.HubStandIn({}, tokens={"hf_write"}, multipart_bytes=256 << 10) as hub:
      env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_write", "HF_HUB_CACHE": cache}
      result = self.way_back("hf://tiny-org/tiny-back@converted", "--hub_private", env=env)
      self.assertIn("output:        hf://tiny-org/tiny-back@converted", result.stdout)
      self.assert_same_files(hub.files("tiny-org/tiny-back", "converted"), local)
      self.assertEqual(hub.files("tiny-org/tiny-back", "main"), {})  # Only the branch named got the commit.
      self.assertTrue(hub.private["tiny-org/tiny-back"])
      self.assertLen(hub.commits, 1)
      self.assertEqual(sorted(hub.commits[0]["added"]), sorted(local))
      self.assertIsNotNone(hub.commits[0]["header"].get("parentCommit"))
      self.assertLen(hub.lfs, len(shards))  # Each shard one object, in parts of 256 KiB where larger.
      self.assertGreater(len(hub.uploads), len(shards))
      # What a user does next: convert the pushed repo from the Hub, which gives the original checkpoint back.
      self.assert_same_as_local(self.convert("tiny-org/tiny-back", "--revision=converted", env=env))

  def test_an_interrupted_push_sends_only_what_is_missing(self):
    local = self.local_way_back()
    shards = sorted(n for n in local if n.endswith(".safetensors"))
    scratch = harness.scratch_dir("hub-staging-")
    with hub_stand_in.HubStandIn({}, hold_upload=2) as hub:
      env = harness.converter_env(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_TOKEN="hf_write", TMPDIR=scratch)
      env.pop("HF_HUB_OFFLINE", None)
      interrupted = subprocess.Popen(harness.converter_command(
          "--direction=to_huggingface", f"--checkpoint_path={os.path.join(self.reference, '0', 'items')}",
          "--output_dir=hf://tiny-org/tiny-back", "--max_shard_size=1MB", "--noprogress"),
          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
      try:
        self.assertTrue(hub.holding.wait(300), "the second shard's upload never started")
        # The first shard, sent, left the disk; the second is being sent, at most the third waits for it.
        staged = [n for d in os.listdir(scratch) for n in os.listdir(os.path.join(scratch, d))]
        self.assertNotIn(shards[0], staged)
        self.assertIn(shards[1], staged)
        self.assertLessEqual(len(staged), 2)
      finally:
        interrupted.kill()  # As a preempted machine stops: mid-upload, nothing cleaned up.
        interrupted.wait()
      hub.hold_upload = None
      hub.release()
      self.assertEqual((hub.commits, hub.files("tiny-org/tiny-back")), ([], {}))
      sent = set(hub.lfs)
      self.assertLen(sent, 1)
      hub.uploads.clear()
      self.way_back("hf://tiny-org/tiny-back", env={"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_write", "TMPDIR": scratch})
      self.assert_same_files(hub.files("tiny-org/tiny-back"), local)
      self.assertLen(hub.uploads, len(shards) - 1)
      self.assertFalse(sent & set(hub.uploads))
      # The killed push's staged shards went with the run that followed it, which left nothing either.
      self.assertEqual(os.listdir(scratch), [])

  def test_a_refused_token_and_a_repo_holding_a_checkpoint_change_nothing(self):
    local = self.local_way_back()
    existing = harness.scratch_dir("hub-existing-")
    before = {"USAGE.md": b"Files that are not weights stay.\n", "model.safetensors": b"stale weights",
              "config.json": b"{}"}
    for name, data in before.items():
      with open(os.path.join(existing, name), "wb") as f:
        f.write(data)
    with hub_stand_in.HubStandIn({"tiny-org/existing": existing}, tokens={"hf_write"}) as hub:
      repo = "hf://tiny-org/existing"
      line = self.error_line(self.way_back(repo, "--overwrite", env={"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_read"},
                                           check=False))
      self.assertIn(repo, line)
      self.assertIn("refused the token", line)
      env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_write"}
      line = self.error_line(self.way_back(repo, env=env, check=False))
      self.assertIn(f"{repo} (default branch): the repo already holds a checkpoint (config.json, model.safetensors)",
                    line)
      self.assertIn("--overwrite", line)
      self.assertEqual((hub.commits, hub.files("tiny-org/existing")), ([], before))
      self.way_back(repo, "--overwrite", env=env)
      self.assert_same_files(hub.files("tiny-org/existing"), {**local, "USAGE.md": before["USAGE.md"]})
      self.assertLen(hub.commits, 1)
      self.assertEqual(hub.commits[0]["deleted"], ["model.safetensors"])
    # A MaxText checkpoint is not pushed: refused before anything is read.
    result = harness.run_converter(f"--hf_model_path={self.model}", "--output_dir=hf://tiny-org/existing",
                                   check=False)
    self.assertNotEqual(result.returncode, 0)
    self.assertIn("--output_dir=hf://... (and --hub_private) are the way back's", result.stderr)

  def test_weights_read_by_ranges_at_one_commit_through_faults(self):
    """A 429, a 503 and a dropped connection are retried and reported; a commit landing on main after the first
    weights were read changes nothing of the checkpoint, which records the commit it read."""
    cache, scratch = harness.scratch_dir("hub-cache-"), harness.scratch_dir("hub-tmp-")
    repo = harness.scratch_dir("hub-repo-")
    for name in os.listdir(self.model):
      shutil.copyfile(os.path.join(self.model, name), os.path.join(repo, name))
    changed = {}
    for shard in self.shards:  # Same header, other values: mixing the new commit in would change the checkpoint.
      with open(os.path.join(self.model, shard), "rb") as f:
        data = bytearray(f.read())
      data[-4096:] = bytes(b ^ 0x55 for b in data[-4096:])
      changed[shard] = bytes(data)
    with hub_stand_in.HubStandIn({REPO: repo}, link=hub_stand_in.LinkLimits(latency_s=0.005)) as hub:
      landed = []
      hub.on_range = lambda number: landed.append(hub.commit(REPO, changed)) if number == 3 else None
      hub.faults.extend([429, 503, "drop"])
      out, result = self.convert(REPO, env={"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": cache, "HF_TOKEN": "hf_read",
                                            "TMPDIR": scratch}, both=True)
      self.assertLen(landed, 1)
      self.assertNotEqual(landed[0], hub_stand_in.COMMIT)
      self.assertEqual(hub.faults_served, [429, 503, "drop"])
      self.assertEqual({revision for _, name, revision in hub.resolves if name.endswith(".safetensors")},
                       {hub_stand_in.COMMIT})
      self.assertIn("Bearer hf_read", hub.authorizations)
      # What the run took from the Hub is what it reports.
      reads = next(line for line in result.stdout.splitlines() if line.startswith("hub reads:"))
      answered = len(hub.ranges) + sum(fault != "drop" for fault in hub.faults_served)  # A drop sent a part.
      self.assertIn(f"{answered:,} ranged requests", reads)
      self.assertIn("3 retried", reads)
      for said in ("HTTP 429", "HTTP 503", "retry 1 of 10"):
        self.assertIn(said, result.stderr)
      self.assert_read_by_ranges(hub, cache, scratch)
    self.assert_same_as_local(out)
    record = ConversionRecord.read(os.path.join(out, "0", "items"))
    self.assertEqual(record.hf_source, {"location": REPO, "revision": hub_stand_in.COMMIT})

  def test_download_first_fetches_the_files_whole_and_a_second_run_asks_nothing(self):
    cache = harness.scratch_dir("hub-cache-")
    with hub_stand_in.HubStandIn({REPO: self.model}) as hub:
      env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": cache}
      out = self.convert(REPO, "--hub_download_first", env=env)
      self.assertEqual(sorted(hub.requested), sorted(["config.json", "model.safetensors.index.json", *self.shards]))
      # A second run finds every file in the cache and asks the Hub for nothing, ranged reads or not.
      self.assertLen(hub.ranges, len(self.shards))  # Each shard whole, in one request.
      hub.requested.clear()
      hub.resolves.clear()
      again = self.convert(REPO, env=env)
      self.assertEqual(hub.requested, [])
      self.assertEqual(hub.resolves, [("HEAD", "config.json", "main")])  # Where main is now: cached already.
      self.assertLen(hub.ranges, len(self.shards))
    self.assert_same_as_local(out)
    self.assert_same_as_local(again)

  def test_from_the_hub_into_a_bucket_interrupted_and_resumed(self):
    """No local copy of the model anywhere; killed halfway, `--resume` reads only what was not written."""
    cache, scratch = harness.scratch_dir("hub-cache-"), harness.scratch_dir("hub-tmp-")
    gcs = gcs_emulator.GcsEmulator()
    gcs.start()
    try:
      gcs.create_bucket("ckpts")
      with hub_stand_in.HubStandIn({REPO: self.model}) as hub:
        halfway, release = threading.Event(), threading.Event()

        def hold_past_half(number: int) -> None:
          del number
          if hub.bytes_sent > self.needed // 2:  # Every read from then on waits: the run stops reading there.
            halfway.set()
            release.wait(120)

        hub.on_range = hold_past_half
        # A short lease: the killed run's lock object is stale by the time the resumed run looks at it.
        env = harness.converter_env(HF_ENDPOINT=hub.url, HF_HUB_CACHE=cache, TMPDIR=scratch,
                                    HF2MAXTEXT_LOCK_LEASE_S="3", **gcs.env)
        env.pop("HF_HUB_OFFLINE", None)
        flags = (f"--hf_model_path={REPO}", "--output_dir=gs://ckpts/tiny", "--simulated_cpu_devices_count=1",
                 "--noprogress", f"--max_inflight_bytes={_BUDGET}")
        log = os.path.join(scratch, "..", os.path.basename(scratch) + ".log")
        with open(log, "w") as stderr:
          interrupted = subprocess.Popen(harness.converter_command(*flags), env=env, stdout=subprocess.DEVNULL,
                                         stderr=stderr)
        try:
          deadline = time.monotonic() + 300
          while not halfway.wait(0.5) and interrupted.poll() is None and time.monotonic() < deadline:
            pass
          with open(log) as f:
            self.assertTrue(halfway.is_set(), f"the conversion never read half the weights:\n{f.read()[-3000:]}")
          while not [n for n in gcs.object_names("ckpts", "tiny") if ".journal." in n] and time.monotonic() < deadline:
            time.sleep(0.1)  # The blocks written so far reach the bucket's resume journal...
          time.sleep(1.5)  # ... every one of them (a part each half second).
        finally:
          interrupted.kill()  # As a preempted machine stops: nothing cleaned up.
          interrupted.wait()
        time.sleep(3.5)
        hub.on_range = None
        release.set()
        result = subprocess.run(harness.converter_command(*flags, "--resume"), env=env, capture_output=True,
                                text=True, timeout=600)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        resumed = int(next(line for line in result.stdout.splitlines() if line.startswith("resumed:")).split()[1])
        self.assertGreater(resumed, 0)
        # What the killed run read and did not write (at most its budget of blocks in flight) is read again.
        self.assertLessEqual(hub.bytes_sent, self.needed + _BUDGET + (64 << 10),
                             "the resumed run read the weights again")
        self.assert_only_configs_on_disk(cache, scratch)
      copy = os.path.join(harness.scratch_dir("hub-gcs-"), "out")
      gcs.download_dir("ckpts", "tiny", copy)
      self.assert_same_as_local(copy)
    finally:
      gcs.stop()

  def test_gated_private_and_missing_files_are_one_line(self):
    cache = harness.scratch_dir("hub-cache-")
    broken = harness.scratch_dir("hub-broken-")
    for name in os.listdir(self.model):
      if name != self.shards[-1]:
        shutil.copyfile(os.path.join(self.model, name), os.path.join(broken, name))
    repos = {"tiny-org/gated": self.model, "tiny-org/private": self.model, "tiny-org/broken": broken}
    with hub_stand_in.HubStandIn(repos, gated={"tiny-org/gated"}, private={"tiny-org/private"},
                                 read_tokens={"hf_member"}, tokens={"hf_write"}) as hub:
      env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": cache, "HF_TOKEN": ""}
      line = self.error_line(self.convert("tiny-org/gated", env=env, check=False))
      self.assertIn("tiny-org/gated (revision main)", line)
      self.assertIn("gated repo; accept its terms on the Hub and set HF_TOKEN", line)
      line = self.error_line(self.convert("tiny-org/private", env=env, check=False))
      self.assertIn("tiny-org/private (revision main)", line)
      self.assertIn("repository not found on the Hub (or private: set HF_TOKEN)", line)
      line = self.error_line(self.convert("tiny-org/broken", env={**env, "HF_TOKEN": "hf_revoked"}, check=False))
      self.assertIn("tiny-org/broken (revision main)", line)
      self.assertIn("the Hub refused the token", line)
      line = self.error_line(self.convert("tiny-org/broken", env=env, check=False))
      self.assertIn(f"hf://tiny-org/broken@{hub_stand_in.COMMIT}/model.safetensors.index.json", line)
      self.assertIn(f"names shard {self.shards[-1]!r}, which does not exist", line)
      self.assertEqual(hub.ranges, [])  # Refused before a byte of the weights was read.

  def test_the_way_back_copies_the_repos_serving_files_from_the_hub(self):
    """The conversion recorded the repo and its commit: the way back fetches the files a server reads besides the
    weights (tokenizer.json, README.md), not the weights in other formats (pytorch_model.bin)."""
    cache = harness.scratch_dir("hub-cache-")
    env = {"HF_ENDPOINT": "", "HF_HUB_CACHE": cache}
    edited = harness.scratch_dir("hub-config-")  # --hf_config_path=ORG/NAME: the config written back comes from there.
    with open(os.path.join(self.model, "config.json")) as f:
      config = json.load(f)
    with open(os.path.join(edited, "config.json"), "w") as f:
      json.dump({**config, "edited_on_the_hub": True}, f)
    with hub_stand_in.HubStandIn({REPO: self.model, "tiny-org/edited": edited}) as hub:
      env["HF_ENDPOINT"] = hub.url
      items = os.path.join(self.convert(REPO, env=env), "0", "items")
      hub.requested.clear()
      back = os.path.join(harness.scratch_dir("hub-back-"), "hf")
      child_env = harness.converter_env(**env)
      child_env.pop("HF_HUB_OFFLINE", None)
      result = subprocess.run(harness.converter_command("--direction=to_huggingface", f"--checkpoint_path={items}",
                                                        f"--output_dir={back}"),
                              env=child_env, capture_output=True, text=True, timeout=600)
      self.assertEqual(result.returncode, 0, result.stderr[-3000:])
      self.assertEqual(sorted(hub.requested), ["README.md", "api/models/tiny-org/tiny-moe/tree", "tokenizer.json"])
      # --hf_config_path=ORG/NAME names another original: its config is written back, its files copied.
      hub.requested.clear()
      edited_back = os.path.join(harness.scratch_dir("hub-back-"), "hf")
      edited_result = subprocess.run(harness.converter_command(
          "--direction=to_huggingface", f"--checkpoint_path={items}", f"--output_dir={edited_back}",
          "--hf_config_path=tiny-org/edited"), env=child_env, capture_output=True, text=True, timeout=600)
      self.assertEqual(edited_result.returncode, 0, edited_result.stderr[-3000:])
      self.assertEqual(sorted(hub.requested), ["api/models/tiny-org/edited/tree", "config.json"])
    with open(os.path.join(edited_back, "config.json")) as f:
      self.assertTrue(json.load(f)["edited_on_the_hub"])
    self.assertIn(f"(from {REPO} (revision {hub_stand_in.COMMIT}))", result.stdout)
    for name in ("tokenizer.json", "README.md"):
      with open(os.path.join(back, name), "rb") as f, open(os.path.join(self.model, name), "rb") as original:
        self.assertEqual(f.read(), original.read(), name)
    self.assertNotIn("pytorch_model.bin", os.listdir(back))

  def test_lora_adapter_from_the_hub(self):
    """--lora_adapter_path=ORG/NAME fetches the adapter's two files only and merges as a local copy does."""
    from tools import lora_adapters  # pylint: disable=g-import-not-at-top

    adapter = lora_adapters.write_random_adapter(self.model, harness.scratch_dir("hub-adapter-"),
                                                 ("model.layers.0.self_attn.q_proj",))
    with open(os.path.join(adapter, "README.md"), "w") as f:
      f.write("not fetched")
    local = self.convert(self.model, f"--lora_adapter_path={adapter}")
    with hub_stand_in.HubStandIn({"tiny-org/tiny-lora": adapter}) as hub:
      out = self.convert(self.model, "--lora_adapter_path=tiny-org/tiny-lora",
                         env={"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": harness.scratch_dir("hub-cache-")})
      self.assertEqual(hub.requested, ["adapter_config.json"])  # Its weights by ranges, like a model's.
      self.assertEqual({name for name, _, _ in hub.ranges}, {"adapter_model.safetensors"})
    merged = checkpoint_io.restore_v0(os.path.join(out, "0", "items"))
    self.assertEqual(checkpoint_io.trees_bit_identical(merged, checkpoint_io.restore_v0(
        os.path.join(local, "0", "items"))), [])
    self.assertNotEqual(checkpoint_io.trees_bit_identical(merged, checkpoint_io.restore_v0(
        os.path.join(self.reference, "0", "items"))), [])

  def test_hub_errors_name_the_repo_and_revision(self):
    cache = harness.scratch_dir("hub-cache-")
    with hub_stand_in.HubStandIn({REPO: self.model}) as hub:
      env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": cache}
      line = self.error_line(self.convert("tiny-org/absent", env=env, check=False))
      self.assertIn("tiny-org/absent (revision main)", line)
      self.assertIn("not found", line)
      line = self.error_line(self.convert(REPO, "--revision=v9", env=env, check=False))
      self.assertIn(f"{REPO} (revision v9)", line)
      self.assertIn("revision 'v9' not found", line)

  def test_offline_from_a_cache_laid_out_by_huggingface_hub(self):
    cache = harness.scratch_dir("hub-cache-")
    hub_stand_in.lay_out_cache(cache, REPO, self.model)
    offline = {"HF_HUB_CACHE": cache, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": _DEAD_ENDPOINT}
    self.assert_same_as_local(self.convert(REPO, env=offline))
    self.assert_same_as_local(self.convert(REPO, f"--revision={hub_stand_in.COMMIT}", env=offline))
    # Not offline, but everything is cached: no request is made (the endpoint is dead).
    self.assert_same_as_local(self.convert(REPO, env={"HF_HUB_CACHE": cache, "HF_ENDPOINT": _DEAD_ENDPOINT}))

    line = self.error_line(self.convert(REPO, "--revision=v9", env=offline, check=False))
    self.assertIn(f"{REPO} (revision v9)", line)
    self.assertIn("HF_HUB_OFFLINE", line)
    line = self.error_line(self.convert("tiny-org/absent", env=offline, check=False))
    self.assertIn("tiny-org/absent (revision main)", line)

  def test_missing_shard_in_the_cache_is_named(self):
    cache = harness.scratch_dir("hub-cache-")
    snapshot = hub_stand_in.lay_out_cache(cache, REPO, self.model)
    os.remove(os.path.join(snapshot, self.shards[-1]))
    line = self.error_line(self.convert(REPO, env={"HF_HUB_CACHE": cache, "HF_HUB_OFFLINE": "1"}, check=False))
    self.assertIn(self.shards[-1], line)
    self.assertIn(REPO, line)
    shutil.rmtree(cache)


if __name__ == "__main__":
  absltest.main()
