"""`--hf_model_path=ORG/NAME`: through a local stand-in for the Hub's file endpoint, and offline from a cache laid
out as huggingface_hub lays it out; the result equals converting the same files from a local directory."""

from __future__ import annotations

import os
import shutil
import subprocess

from absl.testing import absltest

from integration_tests import fixtures, harness
from integration_tests import hub_stand_in

harness.start_jax()

from tools import checkpoint_io  # pylint: disable=g-import-not-at-top

REPO = "tiny-org/tiny-moe"
_DEAD_ENDPOINT = "http://127.0.0.1:9"  # Nothing listens there: a request would fail at once.


class HubTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = fixtures.write_moe("hub-hf-", fixtures.SMALL_MOE, max_shard_bytes=2 << 20)
    cls.shards = sorted(n for n in os.listdir(cls.model) if n.endswith(".safetensors"))
    # What a real repo also holds, and a conversion must not fetch.
    for extra in ("tokenizer.json", "pytorch_model.bin", "README.md"):
      with open(os.path.join(cls.model, extra), "wb") as f:
        f.write(os.urandom(1 << 16))
    cls.reference = cls.convert(cls.model)

  @classmethod
  def convert(cls, model: str, *flags: str, env: dict[str, str] | None = None,
              check: bool = True) -> str | subprocess.CompletedProcess:
    out = os.path.join(harness.scratch_dir("hub-out-"), "out")
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
    return out

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

  def test_downloads_only_what_the_conversion_reads(self):
    cache = harness.scratch_dir("hub-cache-")
    with hub_stand_in.HubStandIn({REPO: self.model}) as hub:
      out = self.convert(REPO, env={"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": cache, "HF_TOKEN": "hf_test_token"})
      self.assertEqual(sorted(hub.requested),
                       sorted(["config.json", "model.safetensors.index.json", *self.shards]))
      self.assertIn("Bearer hf_test_token", hub.authorizations)
      # A second run finds every file in the cache and asks the Hub for nothing.
      hub.requested.clear()
      again = self.convert(REPO, env={"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": cache})
      self.assertEqual(hub.requested, [])
    self.assert_same_as_local(out)
    self.assert_same_as_local(again)

  def test_the_way_back_copies_the_repos_serving_files_from_the_hub(self):
    """The conversion recorded the repo and its commit: the way back fetches the files a server reads besides the
    weights (tokenizer.json, README.md), not the weights in other formats (pytorch_model.bin)."""
    cache = harness.scratch_dir("hub-cache-")
    env = {"HF_ENDPOINT": "", "HF_HUB_CACHE": cache}
    with hub_stand_in.HubStandIn({REPO: self.model}) as hub:
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
      self.assertEqual(sorted(hub.requested), ["adapter_config.json", "adapter_model.safetensors"])
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
