"""tools/bit_flips.py on a stand-in step directory: where the flips land, what one flip changes, and how each
trial's restore is classified."""

import collections
import os
import random
import tempfile

from absl.testing import absltest

from tools import bit_flips


def _step(files: dict[str, bytes]) -> str:
  step = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
  for name, data in files.items():
    os.makedirs(os.path.dirname(os.path.join(step, name)), exist_ok=True)
    with open(os.path.join(step, name), "wb") as f:
      f.write(data)
  return step


def _read_all(step: str) -> bytes:
  return b"".join(open(os.path.join(step, name), "rb").read() for name in bit_flips.data_files(step))


class BitFlipsTest(absltest.TestCase):

  def test_flips_land_in_data_files_only_weighted_by_their_bytes(self):
    step = _step({"items/d/small": b"\0" * 100, "items/ocdbt.process_0/d/large": b"\0" * 900,
                  "items/_METADATA": b"{}", "items/manifest.ocdbt": b"\0" * 1000})
    self.assertEqual(bit_flips.data_files(step), ["items/d/small", "items/ocdbt.process_0/d/large"])
    rng = random.Random(0)
    landed = collections.Counter(bit_flips.pick_flip(step, rng).path for _ in range(2000))
    self.assertEqual(set(landed), {"items/d/small", "items/ocdbt.process_0/d/large"})
    self.assertBetween(landed["items/d/small"] / 2000, 0.07, 0.13)

  def test_a_flip_changes_exactly_one_bit(self):
    step = _step({"items/d/a": bytes(range(256))})
    before = _read_all(step)
    flip = bit_flips.pick_flip(step, random.Random(3))
    bit_flips.apply_flip(step, flip)
    after = _read_all(step)
    changed = [i for i, (x, y) in enumerate(zip(before, after)) if x != y]
    self.assertEqual(changed, [flip.offset])
    self.assertEqual(before[flip.offset] ^ after[flip.offset], 1 << flip.bit)

  def test_trials_classify_each_restore(self):
    items = os.path.join(_step({"items/d/a": b"\0" * 64}), "items")

    def restore(path: str) -> bytes:
      data = open(os.path.join(path, "d", "a"), "rb").read()
      if any(data[:16]):
        raise ValueError("DATA_LOSS: Digest mismatch")  # A checksummed region.
      return data[:48]  # Bytes 48-63 are never read.

    counts = bit_flips.run_trials(items, 200, restore, lambda a, b: a == b)
    self.assertEqual(sum(counts.values()), 200)
    self.assertBetween(counts["raised"] / 200, 0.15, 0.35)  # 16 of 64 bytes.
    self.assertBetween(counts["silent"] / 200, 0.4, 0.6)  # 32 of 64.
    self.assertBetween(counts["harmless"] / 200, 0.15, 0.35)  # 16 of 64.
    self.assertEqual(os.listdir(os.path.dirname(items)), ["items"])  # Every trial worked on a copy.
    self.assertEqual(_read_all(os.path.dirname(items)), b"\0" * 64)


if __name__ == "__main__":
  absltest.main()
