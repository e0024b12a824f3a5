"""Bad input: each case exits 1 with one message naming the file, tensor and reason, and leaves nothing that
looks like a finished checkpoint (no OUT/0, no commit_success.txt anywhere under OUT).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from absl.testing import absltest

from integration_tests import harness

harness.start_jax()

import numpy as np  # pylint: disable=g-import-not-at-top,g-bad-import-order
from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

from tools.testing import tiny_models  # pylint: disable=g-import-not-at-top
from tools.safetensors_writer import write_safetensors  # pylint: disable=g-import-not-at-top

SAFETENSORS = "model.safetensors"


def _can_mount_tmpfs() -> bool:
  probe = harness.scratch_dir("mount-probe-")
  result = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                           f"mount -t tmpfs -o size=64k tmpfs {probe}"], capture_output=True, check=False)
  return result.returncode == 0


class _Variants(absltest.TestCase):
  """Variants of a good tiny checkpoint (`MODEL`, built once per class) with its config or tensors replaced."""

  MODEL = ""
  MODEL_CONFIG: dict = {}

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.good = tiny_models.build_tiny_model(cls.MODEL, harness.scratch_dir("good-"), **cls.MODEL_CONFIG)
    cls.tensors = load_file(os.path.join(cls.good, SAFETENSORS))
    with open(os.path.join(cls.good, "config.json")) as f:
      cls.config = json.load(f)

  def variant(self, *, config=None, tensors=None, drop_config=False) -> str:
    """A copy of the good checkpoint with its config or tensors replaced."""
    path = harness.scratch_dir("bad-")
    if not drop_config:
      with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(self.config if config is None else config, f)
    if tensors is None:
      shutil.copy(os.path.join(self.good, SAFETENSORS), path)
    else:
      write_safetensors(os.path.join(path, SAFETENSORS), tensors)
    return path

  def assert_refused(self, model_dir: str, *expected: str, flags: tuple[str, ...] = (), out: str | None = None):
    return harness.assert_refused(self, model_dir, *expected, flags=flags, out=out)


class BadInputTest(_Variants):

  MODEL = "qwen3"
  MODEL_CONFIG = {"num_hidden_layers": 2}

  def test_missing_config(self):
    path = self.variant(drop_config=True)
    self.assert_refused(path, os.path.join(path, "config.json"), "missing")

  def test_malformed_config(self):
    path = self.variant()
    with open(os.path.join(path, "config.json"), "w") as f:
      f.write('{"architectures": ["Qwen3ForCausalLM"], "hidden_size": ')
    self.assert_refused(path, "config.json", "malformed")

  def test_config_missing_a_dimension(self):
    config = dict(self.config)
    del config["num_hidden_layers"]
    self.assert_refused(self.variant(config=config), "config.json", "num_hidden_layers")

  def test_unsupported_architecture_lists_supported(self):
    config = dict(self.config, architectures=["FalconForCausalLM"])
    error = self.assert_refused(self.variant(config=config), "config.json", "FalconForCausalLM")
    for supported in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM", "MixtralForCausalLM"):
      self.assertIn(supported, error)

  def test_truncated_safetensors(self):
    path = self.variant()
    file = os.path.join(path, SAFETENSORS)
    os.truncate(file, os.path.getsize(file) - 4096)
    self.assert_refused(path, file, "truncated file", "model.")

  def test_corrupt_header_length(self):
    path = self.variant()
    file = os.path.join(path, SAFETENSORS)
    with open(file, "r+b") as f:
      f.write((1 << 60).to_bytes(8, "little"))
    self.assert_refused(path, file, "corrupt safetensors header")

  def test_corrupt_header_json(self):
    path = self.variant()
    file = os.path.join(path, SAFETENSORS)
    with open(file, "r+b") as f:
      f.seek(8)
      f.write(b"{{{{garbage")
    self.assert_refused(path, file, "corrupt safetensors header", "not valid JSON")

  def test_index_names_missing_shard(self):
    path = tiny_models.build_tiny_model("qwen3", harness.scratch_dir("sharded-"), num_hidden_layers=2,
                                        max_shard_size="500KB")
    shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    self.assertGreater(len(shards), 1)
    os.remove(os.path.join(path, shards[-1]))
    self.assert_refused(path, "model.safetensors.index.json", shards[-1], "does not exist")

  def test_missing_tensor(self):
    tensors = {k: v for k, v in self.tensors.items() if k != "model.layers.1.mlp.up_proj.weight"}
    self.assert_refused(self.variant(tensors=tensors), "model.layers.1.mlp.up_proj.weight", "missing")

  def test_unexpected_tensor_refused_then_allowed(self):
    tensors = dict(self.tensors, **{"model.layers.0.mlp.extra_proj.weight": np.zeros((4, 4), np.float32)})
    path = self.variant(tensors=tensors)
    self.assert_refused(path, "model.layers.0.mlp.extra_proj.weight", "--allow_unused_tensors")
    out = harness.scratch_dir("out-")
    result = harness.run_converter(f"--hf_model_path={path}", f"--output_dir={out}", "--simulated_cpu_devices_count=1",
                                   "--allow_unused_tensors")
    self.assertIn("warning:       1 unused tensor(s): model.layers.0.mlp.extra_proj.weight", result.stdout)
    self.assertTrue(os.path.exists(os.path.join(out, "0", "commit_success.txt")))

  def test_shape_disagrees_with_config(self):
    config = dict(self.config, intermediate_size=self.config["intermediate_size"] + 8)
    self.assert_refused(self.variant(config=config), SAFETENSORS, "mlp.gate_proj.weight", "has shape", "implies")

  def test_quantized_integer_weights(self):
    name = "model.layers.0.self_attn.q_proj.weight"
    tensors = dict(self.tensors, **{name: self.tensors[name].astype(np.int8)})
    self.assert_refused(self.variant(tensors=tensors), name, "I8", "dequantized")

  def test_existing_checkpoint_needs_overwrite(self):
    out = harness.scratch_dir("out-")
    harness.run_converter(f"--hf_model_path={self.good}", f"--output_dir={out}", "--simulated_cpu_devices_count=1")
    result = harness.run_converter(f"--hf_model_path={self.good}", f"--output_dir={out}",
                                   "--simulated_cpu_devices_count=1", check=False)
    self.assertEqual(result.returncode, 1)
    self.assertIn("already exists", result.stderr)
    self.assertIn("--overwrite", result.stderr)
    self.assertTrue(os.path.exists(os.path.join(out, "0", "commit_success.txt")))  # Untouched.
    harness.run_converter(f"--hf_model_path={self.good}", f"--output_dir={out}", "--simulated_cpu_devices_count=1",
                          "--overwrite")

  def test_dry_run_prints_the_plan_and_writes_nothing(self):
    out = os.path.join(harness.scratch_dir("dry-"), "out")
    result = harness.run_converter(f"--hf_model_path={self.good}", f"--output_dir={out}", "--dry_run")
    self.assertRegex(result.stdout, r"decoder/layers/mlp/wi_0/kernel +\(256, 2, 512\) +bfloat16 +524,288 +F32 +"
                     r"model\.layers\.0\.mlp\.gate_proj\.weight, model\.layers\.1\.mlp\.gate_proj\.weight")
    self.assertIn("leaves:            14", result.stdout)
    self.assertIn("predicted peak RSS:", result.stdout)
    self.assertFalse(os.path.exists(out))

  def test_dry_run_reports_what_the_run_would_hit(self):
    config = dict(self.config, intermediate_size=self.config["intermediate_size"] + 8)
    self.assert_refused(self.variant(config=config), "mlp.gate_proj.weight", "has shape", flags=("--dry_run",))

  def _in_tmpfs(self, mount_options: str, *flags: str) -> subprocess.CompletedProcess:
    """Runs the converter with OUT on a private tmpfs (a user+mount namespace: no root needed, nothing leaks)."""
    if not _can_mount_tmpfs():
      self.skipTest("cannot mount a private tmpfs here (unshare --user --mount refused)")
    mount_point = harness.scratch_dir("tmpfs-")
    env = harness.converter_env()
    script = (f"mount -t tmpfs -o {mount_options} tmpfs {mount_point} && "
              f"{sys.executable} {harness.CONVERTER_MAIN} --hf_model_path={self.good} "
              f"--output_dir={mount_point}/out --simulated_cpu_devices_count=1 {' '.join(flags)}; rc=$?; "
              f"find {mount_point} -name commit_success.txt; test -e {mount_point}/out/0 && echo STEP_DIR_EXISTS; "
              "exit $rc")
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
                          env=env, capture_output=True, text=True, timeout=600, check=False)

  def test_full_disk(self):
    result = self._in_tmpfs("size=256k")
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    error = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    self.assertLen(error, 1)
    self.assertIn("No space left on device", error[0])
    self.assertRegex(error[0], r"tensor '[a-z_/]+")  # Names the leaf being written.
    self.assertNotIn("commit_success.txt", result.stdout)
    self.assertNotIn("STEP_DIR_EXISTS", result.stdout)

  def test_read_only_output(self):
    result = self._in_tmpfs("size=1m,ro")
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    error = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    self.assertLen(error, 1)
    self.assertRegex(error[0], r"Read-only file system|not writable")
    self.assertIn("/out", error[0])
    self.assertNotIn("STEP_DIR_EXISTS", result.stdout)


class HostileInputTest(_Variants):
  """Malformed JSON, sizes a file claims and cannot hold, and uncommitted checkpoints: each one `error:` line,
  both directions. One converted checkpoint (setUpClass) is copied and damaged for the way-back cases."""

  MODEL = "qwen3"
  MODEL_CONFIG = {"num_hidden_layers": 2}

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.sharded = tiny_models.build_tiny_model("qwen3", harness.scratch_dir("sharded-"), num_hidden_layers=2,
                                               max_shard_size="2MB")
    cls.converted = harness.scratch_dir("converted-")
    harness.run_converter(f"--hf_model_path={cls.good}", f"--output_dir={cls.converted}",
                          "--simulated_cpu_devices_count=1")

  def _index_variant(self, text: bytes) -> str:
    path = harness.scratch_dir("index-")
    for name in os.listdir(self.sharded):
      shutil.copy(os.path.join(self.sharded, name), path)
    with open(os.path.join(path, "model.safetensors.index.json"), "wb") as f:
      f.write(text)
    return path

  def _checkpoint_copy(self, step_name: str = "0") -> str:
    """A copy of the converted checkpoint's step 0, as `step_name`; returns the step directory."""
    step = os.path.join(harness.scratch_dir("ckpt-"), step_name)
    shutil.copytree(os.path.join(self.converted, "0"), step)
    return step

  def assert_refused_back(self, checkpoint: str, *expected: str, flags: tuple[str, ...] = ()):
    """As assert_refused, for both directions that read a MaxText checkpoint: back to HF and the re-layout (one
    that failed mid-save keeps its blocks for --resume, never a committed step)."""
    for direction in ("to_huggingface", "to_maxtext"):
      harness.assert_run_refused(self, harness.scratch_dir("out-"), f"--direction={direction}",
                                 f"--checkpoint_path={checkpoint}", *flags, expected=expected)

  def test_index_of_the_wrong_shape(self):
    with open(os.path.join(self.sharded, "model.safetensors.index.json")) as f:
      weight_map = json.load(f)["weight_map"]
    first = next(iter(weight_map))
    cases = [({"weight_map": None}, "a weight_map that is null"), ({"weight_map": []}, "a weight_map that is an array"),
             ({"weight_map": 7}, "a weight_map that is a number"), ({"weight_map": {}}, "the index lists no tensors"),
             ({"weight_map": dict(weight_map, **{first: 5})}, "which is not the name of a file beside the index"),
             ({"weight_map": dict(weight_map, **{first: "/etc/hostname"})}, "'/etc/hostname', which is not"),
             ({"weight_map": dict(weight_map, **{first: "../x.safetensors"})}, "'../x.safetensors', which is not")]
    for index, reason in cases:
      with self.subTest(reason=reason):
        self.assert_refused(self._index_variant(json.dumps(index).encode()), "model.safetensors.index.json", reason)
    self.assert_refused(self._index_variant(b'{"weight_map": {"model.norm.weight": "caf\xe9"}}'),
                        "model.safetensors.index.json", "not valid JSON: UnicodeDecodeError")

  def test_header_nested_without_bound(self):
    path = self.variant()
    file = os.path.join(path, SAFETENSORS)
    raw = b"[" * 200_000 + b"]" * 200_000
    with open(file, "wb") as f:
      f.write(len(raw).to_bytes(8, "little") + raw)
    self.assert_refused(path, file, "corrupt safetensors header", "nested deeper")

  def test_header_entry_of_the_wrong_type(self):
    tensors = dict(self.tensors)
    path = self.variant(tensors=tensors)
    file = os.path.join(path, SAFETENSORS)
    with open(file, "rb") as f:
      length = int.from_bytes(f.read(8), "little")
      header, data = json.loads(f.read(length)), f.read()
    header["model.norm.weight"]["shape"] = [True, 256]
    raw = json.dumps(header).encode()
    with open(file, "wb") as f:
      f.write(len(raw).to_bytes(8, "little") + raw + data)
    self.assert_refused(path, file, "'model.norm.weight'", "non-negative integers")

  def test_config_claiming_more_layers_than_the_files_hold(self):
    for layers in (10**7, 2**31):
      with self.subTest(layers=layers):
        self.assert_refused(self.variant(config=dict(self.config, num_hidden_layers=layers)), "config.json",
                            f"num_hidden_layers is {layers:,}, more than", "25 tensors")

  def test_rope_scaling_of_an_impossible_shape(self):
    for rope, reason in [([1, 2], "rope_scaling is [1, 2]"),
                         ({"rope_type": "yarn", "factor": "x"}, "rope_scaling.factor is 'x'"),
                         ({"rope_type": "nope", "factor": 2.0}, "rope_type 'nope' is not a rope type"),
                         ({"factor": 2.0}, "has a factor but no rope_type")]:
      with self.subTest(reason=reason):
        self.assert_refused(self.variant(config=dict(self.config, rope_scaling=rope)), "config.json", reason)

  def test_record_claiming_more_layers_than_the_checkpoint_holds(self):
    step = self._checkpoint_copy()
    metadata_path = os.path.join(step, "_CHECKPOINT_METADATA")
    with open(metadata_path) as f:
      metadata = json.load(f)
    metadata["custom_metadata"]["hf2maxtext"]["hf_config"]["num_hidden_layers"] = 2**31
    with open(metadata_path, "w") as f:
      json.dump(metadata, f)
    self.assert_refused_back(os.path.join(step, "items"), "_CHECKPOINT_METADATA", "num_hidden_layers is"
                             " 2,147,483,648, more than", "14 tensors")

  def test_checkpoint_metadata_nested_without_bound(self):
    step = self._checkpoint_copy()
    with open(os.path.join(step, "_CHECKPOINT_METADATA"), "wb") as f:
      f.write(b'{"custom_metadata": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")
    self.assert_refused_back(step, "_CHECKPOINT_METADATA", "unreadable checkpoint metadata", "nested deeper")

  def test_missing_ocdbt_manifest_or_process_database(self):
    step = self._checkpoint_copy()
    os.remove(os.path.join(step, "items", "manifest.ocdbt"))
    self.assert_refused_back(step, os.path.join(step, "items", "manifest.ocdbt"), "missing")
    step = self._checkpoint_copy()
    shutil.rmtree(os.path.join(step, "items", "ocdbt.process_0"))
    self.assert_refused_back(step, "file(s) of the checkpoint's OCDBT database are missing",
                             os.path.join(step, "items", "ocdbt.process_0", "d", ""))

  def test_uncommitted_step_is_refused_unless_allowed(self):
    step = self._checkpoint_copy("0.orbax-checkpoint-tmp-1765000000")
    self.assert_refused_back(step, "not a committed checkpoint", f"{step} is the temporary directory",
                             "--allow_uncommitted")
    out = harness.scratch_dir("out-")
    result = harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={step}", f"--output_dir={out}",
                                   "--allow_uncommitted")
    self.assertTrue(os.path.exists(os.path.join(out, "model.safetensors")), result.stdout)


class BadMultimodalInputTest(_Variants):
  """A multimodal checkpoint (Gemma 3's SigLIP tower) whose tower disagrees with its config, or lacks a part."""

  MODEL = "gemma3_mm"

  def test_tower_config_disagreeing_with_its_tensors(self):
    vision = dict(self.config["vision_config"], intermediate_size=self.config["vision_config"]["intermediate_size"] + 8)
    self.assert_refused(self.variant(config=dict(self.config, vision_config=vision)), SAFETENSORS,
                        "vision_tower.encoder.layers.0.mlp.fc1.weight", "has shape", "implies")

  def test_missing_projector(self):
    tensors = {k: v for k, v in self.tensors.items() if not k.startswith("multi_modal_projector.")}
    self.assert_refused(self.variant(tensors=tensors), "multi_modal_projector.mm_input_projection_weight", "missing")

  def test_tower_maxtext_cannot_run_is_refused_naming_the_key(self):
    vision = dict(self.config["vision_config"], image_size=48)  # 12 patches a side: MaxText pools to 16.
    path = self.variant(config=dict(self.config, vision_config=vision))
    self.assert_refused(path, "vision_config image_size/patch_size = 48/4", "multiple of 16", "--text_only")
    # As the message says: the text decoder alone still converts.
    out = harness.scratch_dir("out-mm-")
    result = harness.run_converter(f"--hf_model_path={path}", f"--output_dir={out}", "--simulated_cpu_devices_count=1",
                                   "--text_only")
    self.assertIn("not the text decoder (the towers MaxText cannot run:", result.stdout)
    self.assertTrue(os.path.exists(os.path.join(out, "0", "commit_success.txt")))

  def test_text_only_skips_the_towers_and_says_so(self):
    out = harness.scratch_dir("out-mm-")
    result = harness.run_converter(f"--hf_model_path={self.good}", f"--output_dir={out}",
                                   "--simulated_cpu_devices_count=1", "--text_only")
    self.assertIn("the SigLIP vision tower (--text_only)", result.stdout)
    self.assertIn("the vision projector (--text_only)", result.stdout)
    self.assertNotIn("use_multimodal=true", result.stdout)
    metadata = os.path.join(out, "0", "items", "_METADATA")
    with open(metadata) as f:
      self.assertNotIn("vision_encoder", f.read())


class MisusedFlagsTest(absltest.TestCase):
  """A misused flag is refused before anything is read, in one line naming the flag and pointing to --help, exit 1:
  not absl's usage (170 lines) before the reason."""

  def test_each_misuse_is_one_line_naming_the_flag(self):
    back = ("--direction=to_huggingface", "--checkpoint_path=/nowhere/0/items", "--output_dir=/nowhere/hf")
    forward = ("--hf_model_path=/nowhere/model", "--output_dir=/nowhere/out")
    cases = {  # The flags, and what the line must name.
        "a way-there flag on the way back": ((*back, "--save_dtype=float32"), "--save_dtype applies to"),
        "a way-back flag on the way there": ((*forward, "--export=lora_adapter"), "--export applies to"),
        "a required flag left out": (("--output_dir=/nowhere/out",), "requires --hf_model_path"),
        "two inputs": ((*forward, "--checkpoint_path=/nowhere/0/items"), "--hf_model_path or --checkpoint_path"),
        "an unknown flag": ((*forward, "--save_dtpye=float32"), "'save_dtpye'"),
        "a bad enum value": ((*forward, "--save_dtype=float16"), "--save_dtype=float16: value should be one of"),
        "a bad integer": ((*forward, "--num_processes=two"), "--num_processes=two"),
        "an integer out of range": ((*forward, "--zstd_level=99"), "--zstd_level=99"),
        "a stray argument": ((*forward, "model.safetensors"), "unexpected arguments: model.safetensors"),
    }
    runs = {what: subprocess.Popen(harness.converter_command(*flags), env=harness.converter_env(),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for what, (flags, _) in cases.items()}
    for what, run in runs.items():
      stdout, stderr = run.communicate(timeout=300)
      with self.subTest(what):
        self.assertEqual(run.returncode, 1, stderr)
        self.assertEqual(stdout, "")
        self.assertLen(stderr.splitlines(), 1, stderr)
        self.assertRegex(stderr, r"^error: .+ \(see --help\)\n$")
        self.assertIn(cases[what][1], stderr)


if __name__ == "__main__":
  absltest.main()
