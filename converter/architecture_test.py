"""The layers of docs/architecture.md, checked on the code: every import of a converter module (at the top of a
module or inside a function) goes to its own layer or one below, so the graph has no circle."""

import ast
import os

from absl.testing import absltest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Lowest first. A package stands for every module in it; a name with a dot is one module at converter/'s top.
LAYERS = (
    ("handlers", "converter.arrays", "converter.errors", "converter.library_logs", "converter.malloc",
     "converter.write_behind"),
    ("converter/storage", "converter.json_input", "converter.ops", "converter.model_config", "converter.processes",
     "converter.progress"),
    ("converter/checkpoint_format",),
    ("converter/sources",),
    ("converter/families",),
    ("converter/layout",),
    ("converter.options",),
    ("converter/lora",),
    ("converter/planning",),
    ("converter/output", "converter.verify", "converter.dry_run"),
    ("converter/reverse",),
    ("converter.conversion",),
    ("converter.main",),
)
_RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def _unit(module: str) -> str | None:
  """The layer unit of a dotted module name: its package under converter/, or the top-level module."""
  parts = module.split(".")
  if parts[0] == "handlers":
    return "handlers"
  if parts[0] != "converter" or len(parts) < 2:
    return None
  if os.path.isdir(os.path.join(_ROOT, "converter", parts[1])):
    return f"converter/{parts[1]}"
  return f"converter.{parts[1]}"


def imports() -> list[tuple[str, str, str]]:
  """(file, importing unit, imported unit) for every import between two units of converter/."""
  found = []
  for directory, _, files in os.walk(os.path.join(_ROOT, "converter")):
    for name in files:
      if not name.endswith(".py") or name.endswith("_test.py"):
        continue
      path = os.path.join(directory, name)
      relative = os.path.relpath(path, _ROOT)[:-len(".py")].replace(os.sep, ".")
      source = _unit(relative)
      with open(path) as f:
        tree = ast.parse(f.read())
      for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
          targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
          targets = [alias.name for alias in node.names]
        else:
          continue
        for unit in {_unit(target) for target in targets}:
          if unit is not None and unit != source:
            found.append((os.path.relpath(path, _ROOT), source, unit))
  return found


class ArchitectureTest(absltest.TestCase):

  def test_every_unit_has_a_layer(self):
    units = {source for _, source, _ in imports()} | {target for _, _, target in imports()}
    self.assertEqual(sorted(units - set(_RANK)), [])

  def test_no_import_goes_up(self):
    upward = [f"{path}: {source} -> {target}" for path, source, target in imports()
              if _RANK.get(target, -1) > _RANK.get(source, len(LAYERS))]
    self.assertEqual(upward, [])

  def test_the_check_sees_an_upward_import(self):
    # The control: a source that reads the record through the output package would be caught.
    self.assertGreater(_RANK["converter/output"], _RANK["converter/sources"])
    self.assertIn(("converter/lora/lora_export.py", "converter/lora", "converter/checkpoint_format"),
                  set(imports()))


if __name__ == "__main__":
  absltest.main()
