"""JSON read from the files a user hands the converter (config.json, a safetensors index or header, an adapter's
config, a checkpoint's metadata): every way such a file can be malformed is one ConversionError naming it.

`json.loads` alone lets through what later code trips over: bytes that are not UTF-8 (UnicodeDecodeError), nesting
deep enough to exhaust Python's stack (RecursionError), integers longer than Python converts (ValueError), and a
file of any size read whole. Here each is refused with the file's name, and a value nested deeper than any real
file nests it is refused too, so that nothing downstream (a record written back by Orbax, a config copied to the
output) recurses through a hostile structure.
"""

from __future__ import annotations

import json
from typing import Any

from converter import storage
from converter.errors import ConversionError

MAX_BYTES = 100 << 20  # config.json, an index, a checkpoint's metadata: kilobytes to a few megabytes in practice.
MAX_DEPTH = 64  # Real files nest a handful of levels (a multimodal config's text_config.rope_scaling).


def parse(data: bytes | str, path: str, what: str) -> Any:
  """`data` (the contents of `path`, a `what`) parsed; a ConversionError `PATH: WHAT (not valid JSON: ...)`."""
  try:
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    value = json.loads(text)
  except RecursionError as e:
    raise ConversionError(f"{path}: {what} (not valid JSON: nested deeper than the parser's stack)") from e
  except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits.
    raise ConversionError(f"{path}: {what} (not valid JSON: {type(e).__name__}: {e})") from e
  if not _within_depth(value, MAX_DEPTH):
    raise ConversionError(f"{path}: {what} (JSON nested more than {MAX_DEPTH} levels deep)")
  return value


def read(path: str, what: str) -> Any:
  """The JSON file at `path` (a `what`, named in errors). FileNotFoundError passes through for a local file, so
  that a caller can say what a missing one means; other read errors are ConversionErrors naming the file."""
  try:
    size = storage.size(path)
    if size > MAX_BYTES:
      raise ConversionError(f"{path}: {what} ({size:,} bytes, more than the {MAX_BYTES:,} such a file may hold)")
    data = storage.read_bytes(path)
  except FileNotFoundError:
    raise
  except OSError as e:
    raise ConversionError(f"{path}: cannot read {what} ({type(e).__name__}: {e})") from e
  return parse(data, path, what)


def read_object(path: str, what: str) -> dict[str, Any]:
  """`read`, refusing anything but a JSON object."""
  value = read(path, what)
  if not isinstance(value, dict):
    raise ConversionError(f"{path}: {what} (not a JSON object but {type_name(value)})")
  return value


def type_name(value: Any) -> str:
  """The JSON name of `value`'s type, for messages."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "a boolean"
  if isinstance(value, (int, float)):
    return "a number"
  if isinstance(value, str):
    return "a string"
  return "an array" if isinstance(value, list) else "an object"


def is_int(value: Any) -> bool:
  """A JSON integer: not a boolean (a Python int too), not a float, even one with an integral value."""
  return isinstance(value, int) and not isinstance(value, bool)


def _within_depth(value: Any, limit: int) -> bool:
  """Whether no array or object in `value` lies more than `limit` levels deep (walked without recursion)."""
  pending = [(value, 1)]
  while pending:
    node, depth = pending.pop()
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
    if children is None:
      continue
    if depth > limit:
      return False
    pending.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
  return True
