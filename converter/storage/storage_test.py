"""Paths and their tensorstore kvstore specs, the emulator variable and error wording of converter.storage (the
bucket calls themselves run against a real GCS endpoint in integration_tests/gcs_test.py)."""

import os
from unittest import mock

import tensorstore as ts
from absl.testing import absltest

from converter import storage
from converter.errors import ConversionError


class PathsTest(absltest.TestCase):

  def test_bucket_paths_are_kept_and_normalised(self):
    self.assertEqual(storage.resolve("gs://bucket/a//b/"), "gs://bucket/a/b")
    self.assertEqual(storage.join("gs://bucket/a", "0", "items"), "gs://bucket/a/0/items")
    self.assertEqual(storage.parent("gs://bucket/a/b/"), "gs://bucket/a")
    self.assertEqual(storage.basename("gs://bucket/a/b/"), "b")
    self.assertEqual(storage.split_bucket("gs://bucket/a/b"), ("gs", "bucket", "a/b"))
    with self.assertRaisesRegex(ConversionError, "names no bucket"):
      storage.resolve("gs://")

  def test_local_paths_resolve_against_the_directory_bazel_ran_in(self):
    old = os.environ.get("BUILD_WORKING_DIRECTORY")
    os.environ["BUILD_WORKING_DIRECTORY"] = "/somewhere"
    try:
      self.assertEqual(storage.resolve("models/x"), "/somewhere/models/x")
      self.assertEqual(storage.resolve("/abs/x"), "/abs/x")
    finally:
      if old is None:
        os.environ.pop("BUILD_WORKING_DIRECTORY")
      else:
        os.environ["BUILD_WORKING_DIRECTORY"] = old

  def test_s3_is_refused_with_the_reason(self):
    with self.assertRaisesRegex(ConversionError, r"s3://b/x: s3:// is not supported.*s3fs"):
      storage.resolve("s3://b/x")


class KvstoreSpecTest(absltest.TestCase):

  def test_a_local_path_is_a_file_kvstore_tensorstore_reads_the_file_through(self):
    directory = self.create_tempdir().full_path
    storage.write_text(os.path.join(directory, "f"), "0123")
    spec = storage.kvstore_spec(f"{directory}/./sub/../")
    self.assertEqual(spec, {"driver": "file", "path": directory})
    self.assertEqual(ts.KvStore.open({**spec, "path": spec["path"] + "/"}).result().read("f").result().value,
                     b"0123")

  def test_a_relative_local_path_is_refused(self):
    with self.assertRaisesRegex(ConversionError, "^run/items: a checkpoint path must be absolute here$"):
      storage.kvstore_spec("run/items")

  def test_a_bucket_path_names_bucket_and_object_through_the_gcs_backend_orbax_uses(self):
    with mock.patch.dict(os.environ):
      os.environ.pop("TENSORSTORE_GCS_BACKEND", None)
      self.assertEqual(storage.kvstore_spec("gs://bucket/run//0/items/"),
                       {"driver": "gcs", "bucket": "bucket", "path": "run/0/items"})
      self.assertEqual(storage.kvstore_spec("gs://bucket"), {"driver": "gcs", "bucket": "bucket", "path": ""})
      os.environ["TENSORSTORE_GCS_BACKEND"] = "gcs_grpc"
      self.assertEqual(storage.kvstore_spec("gs://bucket/items"),
                       {"driver": "gcs_grpc", "bucket": "bucket", "path": "items"})

  def test_other_schemes_are_refused(self):
    with self.assertRaisesRegex(ConversionError, "^s3://b/items: .* from gs:// buckets or local disks only$"):
      storage.kvstore_spec("s3://b/items")


class EmulatorTest(absltest.TestCase):

  def test_one_variable_points_every_client_at_the_emulator(self):
    environ = {"STORAGE_EMULATOR_HOST": "127.0.0.1:4443"}
    storage.configure_emulator(environ)
    self.assertEqual(environ["TENSORSTORE_GCS_HTTP_URL"], "http://127.0.0.1:4443")
    self.assertIn("GOOGLE_AUTH_TOKEN_FOR_TESTING", environ)
    self.assertEqual(environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"], "false")

  def test_settings_already_made_are_kept_and_nothing_without_the_variable(self):
    environ = {"STORAGE_EMULATOR_HOST": "http://h:1", "TENSORSTORE_GCS_HTTP_URL": "http://other:2"}
    storage.configure_emulator(environ)
    self.assertEqual(environ["TENSORSTORE_GCS_HTTP_URL"], "http://other:2")
    environ = {}
    storage.configure_emulator(environ)
    self.assertEqual(environ, {})


class RetriesTest(absltest.TestCase):

  def test_retry_policy_reaches_gcs_and_s3_resources(self):
    storage.set_request_retries(3)
    try:
      resources = storage.tensorstore_resources()
      self.assertEqual(resources["gcs_request_retries"]["max_retries"], 3)
      self.assertEqual(resources["s3_request_retries"]["max_retries"], 3)
    finally:
      storage.set_request_retries(10)


class ErrorsTest(absltest.TestCase):

  def test_errors_name_bucket_and_object(self):
    cases = [
        (Exception("404 bucket does not exist"), "bucket gs://b does not exist"),
        (Exception("403 Forbidden"), "permission denied on gs://b"),
        (Exception("401 Unauthorized"), "no valid credentials for gs://b"),
        (FileNotFoundError("x"), "object 'dir/file' not found in bucket gs://b"),
        (Exception("something else"), "Exception: something else"),
    ]
    for error, expected in cases:
      message = str(storage.remote_error("gs://b/dir/file", error, "reading"))
      self.assertStartsWith(message, "gs://b/dir/file: reading failed: ")
      self.assertIn(expected, message)


class LocalFilesTest(absltest.TestCase):

  def test_byte_ranges_and_text(self):
    directory = self.create_tempdir().full_path
    path = os.path.join(directory, "f")
    storage.write_text(path, "0123456789")
    self.assertEqual(storage.read_bytes(path, 2, 5), b"234")
    self.assertEqual(storage.read_bytes(path, 7), b"789")
    self.assertEqual(storage.read_text(path), "0123456789")
    self.assertEqual(storage.size(path), 10)
    self.assertEqual(storage.list_names(directory), ["f"])
    storage.move(directory, directory + ".moved")
    self.assertTrue(storage.exists(os.path.join(directory + ".moved", "f")))
    storage.remove_tree(directory + ".moved")
    self.assertFalse(storage.exists(directory + ".moved"))


if __name__ == "__main__":
  absltest.main()
