"""`configured`: Orbax instantiates handler classes itself, passing only a context, so a save's write options travel
on a class of their own, one that Orbax names exactly as the class it configures."""

from absl.testing import absltest

from handlers.write_options import WriteOptions, configured


class _Handler:
  """A handler class as the registries take them: options on the class, read by each instance Orbax makes."""

  write_options = WriteOptions()


def _typestr(cls: type) -> str:
  """How Orbax names a handler class (what a step's metadata records and loads resolve)."""
  return f"{cls.__module__}.{cls.__qualname__}"


class ConfiguredTest(absltest.TestCase):

  def test_the_class_own_options_keep_the_class_itself(self):
    self.assertIs(configured(_Handler, WriteOptions()), _Handler)

  def test_other_options_travel_on_a_subclass_orbax_names_as_the_class(self):
    options = WriteOptions(max_inflight_bytes=1234, compression=False)
    handler = configured(_Handler, options)
    self.assertTrue(issubclass(handler, _Handler))
    self.assertIs(handler().write_options, options)
    self.assertEqual(_typestr(handler), _typestr(_Handler))

  def test_saves_with_their_own_options_do_not_share_them(self):
    first = configured(_Handler, WriteOptions(max_inflight_bytes=1 << 20))
    second = configured(_Handler, WriteOptions(max_inflight_bytes=2 << 20))
    self.assertEqual((first.write_options.max_inflight_bytes, second.write_options.max_inflight_bytes),
                     (1 << 20, 2 << 20))
    self.assertEqual(_Handler.write_options, WriteOptions())  # The class configured is left alone.


if __name__ == "__main__":
  absltest.main()
