"""The package imports lazily: its light modules load without Orbax or JAX (what runs before they load, see
converter/main.py), and the first public name loads the API with the v0 type handler registered."""

import os
import subprocess
import sys

from absl.testing import absltest

_HEAVY = "sorted(m for m in ('jax', 'orbax.checkpoint', 'tensorstore') if m in sys.modules)"


def _run(code: str) -> str:
  result = subprocess.run([sys.executable, "-c", f"import sys; {code}"], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
  return result.stdout.strip().splitlines()[-1]


class PackageTest(absltest.TestCase):

  def test_the_light_modules_import_without_orbax_or_jax(self):
    code = ("import handlers; from handlers import blocks, claims, early_reads, lazy_tensor, shares, write_options;"
            " assert not hasattr(handlers, '__wrapped__');"
            f" print({_HEAVY})")
    self.assertEqual(_run(code), "[]")

  def test_the_first_public_name_loads_the_api_and_registers_the_v0_handler(self):
    code = ("from handlers import LazyTensor; import orbax.checkpoint as ocp;"
            " print(type(ocp.type_handlers.get_type_handler(LazyTensor)).__name__)")
    self.assertEqual(_run(code), "LazyTensorV0Handler")

  def test_an_unknown_name_is_an_attribute_error(self):
    import handlers  # pylint: disable=g-import-not-at-top

    with self.assertRaisesRegex(AttributeError, "no attribute 'NoSuchThing'"):
      handlers.NoSuchThing  # pylint: disable=pointless-statement
    self.assertIn("LazyTensor", dir(handlers))


if __name__ == "__main__":
  absltest.main()
