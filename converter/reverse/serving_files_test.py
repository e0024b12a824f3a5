"""The serving files of an original model: every top-level file but weights, their index and config.json, read
byte for byte; what a server needs and the original lacks is named."""

import os
from unittest import mock

from absl.testing import absltest

from converter.reverse import serving_files


class ServingFilesTest(absltest.TestCase):

  def test_everything_but_weights_index_and_config_is_read_byte_for_byte(self):
    directory = self.create_tempdir().full_path
    contents = {"tokenizer.json": b'{"model": {}}', "tokenizer_config.json": b"{}", "tokenizer.model": bytes(range(256)),
                "chat_template.jinja": b"{{ messages }}", "generation_config.json": b'{"do_sample": false}',
                "preprocessor_config.json": b"{}", "tokenization_kimi.py": b"# remote code", "LICENSE": b"terms"}
    skipped = {"config.json": b"{}", "model.safetensors": b"w", "model-00001-of-00002.safetensors": b"w",
               "model.safetensors.index.json": b"{}", "pytorch_model.bin": b"w", ".gitattributes": b"*"}
    for name, data in {**contents, **skipped}.items():
      with open(os.path.join(directory, name), "wb") as f:
        f.write(data)
    os.makedirs(os.path.join(directory, "original"))  # Subdirectories (consolidated weights) are not copied.
    files = serving_files.read_serving_files(serving_files.Original(directory))
    self.assertEqual(files, contents)
    self.assertEqual(serving_files.missing(files), [])

  def test_files_larger_than_a_server_reads_are_left_out(self):
    directory = self.create_tempdir().full_path
    for name in ("tokenizer.json", "consolidated.tar"):
      with open(os.path.join(directory, name), "wb") as f:
        f.write(b"x" * 100)
    with mock.patch.object(serving_files, "MAX_FILE_BYTES", 50):
      self.assertEqual(serving_files.read_serving_files(serving_files.Original(directory)), {})

  def test_missing_names_the_tokenizer_and_the_expected_files(self):
    self.assertEqual(serving_files.missing({"generation_config.json": b""}),
                     ["tokenizer.json (or tokenizer.model, vocab.json + merges.txt)", "tokenizer_config.json"])
    self.assertEqual(serving_files.missing({"vocab.json": b"", "merges.txt": b"", "tokenizer_config.json": b"",
                                            "generation_config.json": b""}), [])


if __name__ == "__main__":
  absltest.main()
