"""Every malformed JSON input is one ConversionError naming the file; well-formed files read as json reads them."""

import os
import tempfile
from unittest import mock

from absl.testing import absltest

from converter import json_input
from converter.errors import ConversionError


class JsonInputTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.path = os.path.join(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")), "config.json")

  def _write(self, data: bytes) -> None:
    with open(self.path, "wb") as f:
      f.write(data)

  def test_a_well_formed_file_reads_as_written(self):
    self._write(b'{"a": [1, 2.5, null, true], "b": {"c": "\\u00e9"}}')
    self.assertEqual(json_input.read(self.path, "a config"), {"a": [1, 2.5, None, True], "b": {"c": "\u00e9"}})

  def test_each_malformation_names_the_file(self):
    cases = {
        b'{"a": ': "JSONDecodeError",
        b'{"w\xe9ight_map": {}}': "UnicodeDecodeError",
        b"[" * 100_000 + b"]" * 100_000: "nested deeper than the parser's stack",
        b'{"a": ' * 50_000 + b"1" + b"}" * 50_000: "nested deeper than the parser's stack",
        b"[" * 65 + b"]" * 65: "nested more than 64 levels",
        b'{"n": ' + b"9" * 5000 + b"}": "ValueError",  # More digits than Python converts to an int.
    }
    for data, reason in cases.items():
      with self.subTest(data=data[:20]):
        self._write(data)
        with self.assertRaisesRegex(ConversionError, f"^{self.path}: a config \\(.*{reason}"):
          json_input.read(self.path, "a config")

  def test_nesting_up_to_the_limit_is_read(self):
    self._write(b"[" * 64 + b"]" * 64)
    self.assertIsInstance(json_input.read(self.path, "a config"), list)

  def test_a_file_larger_than_any_such_file_is_not_read(self):
    self._write(b" " * 1001)
    with mock.patch.object(json_input, "MAX_BYTES", 1000):
      with self.assertRaisesRegex(ConversionError, f"^{self.path}: a config \\(1,001 bytes, more than the 1,000"):
        json_input.read(self.path, "a config")

  def test_a_missing_file_is_the_callers_to_name(self):
    with self.assertRaises(FileNotFoundError):
      json_input.read(self.path, "a config")

  def test_read_object_refuses_other_types(self):
    for data, kind in ((b"[]", "an array"), (b"null", "null"), (b"3", "a number"), (b'"x"', "a string")):
      with self.subTest(kind=kind):
        self._write(data)
        with self.assertRaisesRegex(ConversionError, f"not a JSON object but {kind}"):
          json_input.read_object(self.path, "a config")

  def test_is_int_excludes_booleans_and_floats(self):
    self.assertEqual([json_input.is_int(v) for v in (3, -1, True, 3.0, "3", None)],
                     [True, True, False, False, False, False])


if __name__ == "__main__":
  absltest.main()
