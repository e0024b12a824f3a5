"""Every stored chunk carries a checksum that every restore verifies: a damaged checkpoint is refused, never
restored as wrong weights.

One conversion per setting (harness.converted), several assertions on each:
- single-bit flips anywhere in the stored data (tools/bit_flips.py), restored through stock Orbax v0 (as MaxText
  restores) and v1, at 1 and 16 devices: none restores silently wrong; the same trials on chunks written without
  checksums (`--nochunk_checksums`, as earlier versions wrote them) do, so the trials see what they guard against;
- every leaf's chunks carry one, whatever the layout: default, eager, `--target_mesh`, `--compression=none`;
- back to HuggingFace: checkpoints with and without checksums give the same safetensors, and a damaged chunk fails
  the conversion naming its leaf.
"""

from __future__ import annotations

import os
import shutil

from absl.testing import absltest, parameterized

from integration_tests import harness

harness.start_jax()

from converter.layout import layout_inspection  # pylint: disable=g-import-not-at-top,g-bad-import-order
from tools import bit_flips, checkpoint_io  # pylint: disable=g-import-not-at-top

MODEL = os.path.join(harness.REPO_ROOT, "testdata", "tiny-qwen3")
TRIALS = 40
LEAF = "params.params.decoder.layers.mlp.wo.kernel"


def _converted(*flags: str) -> str:
  return harness.converted(MODEL, "--save_dtype=float32", *flags)


def _to_huggingface(items: str) -> tuple[int, str, str]:
  out = os.path.join(harness.scratch_dir("back-"), "hf")
  result = harness.run_converter("--direction=to_huggingface", f"--checkpoint_path={items}", f"--output_dir={out}",
                                 check=False)
  return result.returncode, result.stderr, out


class ChecksumTest(parameterized.TestCase):

  @parameterized.parameters(1, 16)
  def test_single_bit_flips_never_restore_silently(self, devices):
    items = _converted(f"--simulated_cpu_devices_count={devices}")
    for api, trials in (("v0", TRIALS), ("v1", TRIALS // 2)):
      counts = bit_flips.orbax_trials(items, trials, api=api, seed=devices)
      self.assertEqual(counts["silent"], 0, (api, counts))
      self.assertGreater(counts["raised"], trials // 2, (api, counts))

  def test_without_checksums_the_same_flips_restore_silently(self):
    trials = TRIALS // 2
    counts = bit_flips.orbax_trials(_converted("--simulated_cpu_devices_count=1", "--nochunk_checksums"), trials)
    # Measured: 65-78% of flips restore silently (60 trials each, two seeds); where they land follows the data files'
    # random names, so a bound at half of 20 trials failed one run in eight. A quarter is still the control.
    self.assertGreater(counts["silent"], trials // 4, counts)

  @parameterized.named_parameters(
      ("devices1", "--simulated_cpu_devices_count=1"),
      ("devices16", "--simulated_cpu_devices_count=16"),
      ("eager", "--simulated_cpu_devices_count=1", "--nolazy_load_tensors"),
      ("target_mesh", "--simulated_cpu_devices_count=16", "--target_mesh=fsdp=4,tensor=2"),
      ("uncompressed", "--simulated_cpu_devices_count=16", "--compression=none"),
      ("unchunked", "--simulated_cpu_devices_count=1", "--nochunk_layout"),
  )
  def test_every_stored_chunk_carries_a_checksum(self, *flags):
    items = _converted(*flags)
    self.assertEqual(layout_inspection.unchecksummed_leaves(items), [])
    self.assertEqual(checkpoint_io.trees_bit_identical(checkpoint_io.restore_v0(items),
                                                       checkpoint_io.restore_v0(_converted("--nochunk_checksums"))),
                     [])

  def test_back_to_huggingface_reads_checkpoints_with_and_without_checksums(self):
    outputs = []
    for flags in (("--simulated_cpu_devices_count=16",), ("--simulated_cpu_devices_count=16", "--nochunk_checksums")):
      returncode, stderr, out = _to_huggingface(_converted(*flags))
      self.assertEqual(returncode, 0, stderr[-2000:])
      outputs.append(checkpoint_io.read_safetensors_dir(out))
    self.assertEqual(outputs[0].keys(), outputs[1].keys())
    for name, tensor in outputs[0].items():
      self.assertEqual(tensor.tobytes(), outputs[1][name].tobytes(), name)

  def test_back_to_huggingface_refuses_a_damaged_chunk_naming_its_leaf(self):
    import tensorstore as ts  # pylint: disable=g-import-not-at-top

    step = os.path.join(harness.scratch_dir("damaged-"), "ckpt")
    shutil.copytree(os.path.dirname(_converted("--simulated_cpu_devices_count=1")), step)
    items = os.path.join(step, "items")
    store = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{items}/"}).result()
    chunk = next(key for key in store.list().result() if key.startswith(f"{LEAF}/c/".encode()))
    stored = bytearray(store.read(chunk).result().value)
    stored[len(stored) // 4] ^= 0x10  # Inside the first inner chunks' bytes; the shard index is at the end.
    store.write(chunk, bytes(stored)).result()
    returncode, stderr, out = _to_huggingface(items)
    self.assertEqual(returncode, 1, stderr[-2000:])
    self.assertIn("leaf params/params/decoder/layers/mlp/wo/kernel", stderr)
    # zstd's content checksum, the index's crc32c, or a frame zstd itself finds malformed (a flip in its header).
    self.assertRegex(stderr, r"doesn't match checksum|Digest mismatch|Data corruption detected")
    self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
  absltest.main()
