"""tools/fuzz_damage.py: each change is what its description says, and the same generator makes the same change."""

from __future__ import annotations

import json
import os
import random
import struct
import tempfile

from absl.testing import absltest

from tools import fuzz_damage


def _safetensors(path: str) -> None:
  header = json.dumps({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                       "b": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}}).encode()
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header + bytes(range(32)))


class FuzzDamageTest(absltest.TestCase):

  def test_a_json_mutation_changes_one_node_the_same_way_for_the_same_generator(self):
    config = {"num_hidden_layers": 2, "rope_scaling": {"factor": 2.0, "type": "yarn"}, "architectures": ["X"]}
    for seed in range(30):
      first = fuzz_damage.mutate_json(json.loads(json.dumps(config)), random.Random(seed))
      second = fuzz_damage.mutate_json(json.loads(json.dumps(config)), random.Random(seed))
      self.assertEqual(first, second)
      self.assertNotEqual(first[0], config, first[1])

  def test_a_mutation_within_a_subtree_stays_there(self):
    value = {"outside": 1, "custom_metadata": {"hf2maxtext": {"save_dtype": "bfloat16", "family": "qwen3"}}}
    for seed in range(20):
      mutated, _ = fuzz_damage.mutate_json(json.loads(json.dumps(value)), random.Random(seed),
                                           within=fuzz_damage.RECORD_PATH)
      self.assertEqual(mutated["outside"], 1)
      self.assertNotEqual(mutated["custom_metadata"]["hf2maxtext"], value["custom_metadata"]["hf2maxtext"])

  def test_header_damage_keeps_the_data_where_the_new_header_says_it_starts(self):
    root = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    for seed in range(40):
      path = os.path.join(root, f"{seed}.safetensors")
      _safetensors(path)
      kind, detail = fuzz_damage.damage_safetensors(root, os.path.basename(path), random.Random(seed))
      if kind in ("dtype", "shape", "data_offsets", "entry", "header_json"):
        with open(path, "rb") as f:
          data = f.read()
        (length,) = struct.unpack("<Q", data[:8])
        self.assertEqual(length % 8, 0)
        json.loads(data[8:8 + length])
        self.assertEqual(data[8 + length:], bytes(range(32)), detail)

  def test_nesting_is_deeper_than_the_parser_goes(self):
    with self.assertRaises(RecursionError):
      json.loads(fuzz_damage.deeply_nested_json())


if __name__ == "__main__":
  absltest.main()
