"""The damage tools/fuzz_inputs.py does to a copy of a good checkpoint: one seeded change per trial, to the files
a HuggingFace checkpoint is read from (config.json, the index, the safetensors) or to those of a converted MaxText
checkpoint (its step's metadata and conversion record, the OCDBT manifests and data files, the arrays' zarr.json).

Every function takes the copy's root and a `random.Random`, changes the files in place and returns a `Damage`
that says what it did; the same generator state on the same files makes the same change, so a trial is replayed
from its seed alone. Nothing here runs the converter.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import struct
from typing import Any, Callable

# What a hostile file puts where a value belongs: wrong types, absurd sizes, nothing at all.
HOSTILE_VALUES: tuple[Any, ...] = (None, True, False, 0, -1, 1, 2**31, 2**31 - 1, 2**63, -(2**63), 10**7, 10**30,
                                   1e308, 0.5, -0.0, "", "x", "0", "bfloat16", [], [0], [1, 2, 3], {}, {"a": None},
                                   [[[]]], {"": {}})
ABSURD_SIZES: tuple[int, ...] = (0, -1, 1, 3, 2**31, 2**31 - 1, 2**32 + 1, 2**63, 10**7, 10**12, 65537)
HUGE_SIZES: tuple[int, ...] = (2**31, 2**31 - 1, 10**7, 10**9, 2**40, 2**63 - 1)
# What a config claims that a conversion may allocate in proportion to.
SIZE_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
             "head_dim", "vocab_size", "num_experts", "moe_intermediate_size", "num_experts_per_tok",
             "max_position_embeddings", "base_num_decoder_layers", "base_emb_dim", "base_mlp_dim")
# config.json keys a conversion sizes its plan by, or decides a layout on.
CONFIG_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "vocab_size", "num_experts", "num_local_experts", "moe_intermediate_size",
               "num_experts_per_tok", "max_position_embeddings", "rope_theta", "rope_scaling", "rope_parameters",
               "tie_word_embeddings", "architectures", "model_type", "torch_dtype", "dtype", "quantization_config",
               "rms_norm_eps", "layer_types", "text_config", "mlp_only_layers", "decoder_sparse_step")
SAFETENSORS_DTYPE_CODES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I64", "I32", "I8", "U8", "BOOL",
                           "F4", "X", "", "bf16")
ZARR_DATA_TYPES = ("float32", "bfloat16", "float16", "int8", "uint8", "float64", "bool", "complex64", "nonsense")
NESTING_DEPTH = 200_000  # Deeper than any JSON parser's recursion limit.


@dataclasses.dataclass(frozen=True)
class Damage:
  """What a trial did to its input: the file (relative to the copy's root), the kind of change, its details.
  `stored_values` is set where the damage hit array data or its description, which the checksums and checks of a
  checkpoint must catch: the way back must then refuse or write the original tensors, never other values.
  `must_refuse` is set where any successful conversion is wrong (a checkpoint whose commit markers are gone)."""

  file: str
  kind: str
  detail: str
  stored_values: bool = False
  must_refuse: bool = False

  def __str__(self) -> str:
    return f"{self.file}: {self.kind} ({self.detail})"


# -- bytes ------------------------------------------------------------------------------------------------------------


def _read(path: str) -> bytes:
  with open(path, "rb") as f:
    return f.read()


def _write(path: str, data: bytes) -> None:
  with open(path, "wb") as f:
    f.write(data)


def flip_bits(path: str, rng: random.Random, begin: int = 0, end: int | None = None) -> str:
  """Flips 1 to 8 random bits of `path` between byte offsets `begin` and `end`."""
  data = bytearray(_read(path))
  end = len(data) if end is None else end
  if end <= begin:
    return "nothing to flip"
  offsets = sorted(rng.randrange(begin, end) for _ in range(rng.choice((1, 1, 1, 2, 8))))
  for offset in offsets:
    data[offset] ^= 1 << rng.randrange(8)
  _write(path, bytes(data))
  return f"bits flipped at {offsets}"


def truncate(path: str, rng: random.Random) -> str:
  size = os.path.getsize(path)
  keep = rng.choice((0, 1, 7, 8, size // 2, size - 1, rng.randrange(max(1, size))))
  keep = max(0, min(keep, size - 1))
  with open(path, "r+b") as f:
    f.truncate(keep)
  return f"truncated to {keep} of {size} bytes"


def damage_bytes(root: str, name: str, rng: random.Random) -> str:
  """A file-level change any file can suffer: flips, truncation, deletion, emptied, garbage, a directory."""
  path = os.path.join(root, name)
  kind = rng.choice(("flip", "flip", "truncate", "truncate", "delete", "empty", "append", "not_utf8", "directory"))
  if kind == "flip":
    return flip_bits(path, rng)
  if kind == "truncate":
    return truncate(path, rng)
  if kind == "delete":
    os.remove(path)
    return "deleted"
  if kind == "empty":
    _write(path, b"")
    return "emptied"
  if kind == "append":
    with open(path, "ab") as f:
      f.write(rng.randbytes(rng.choice((1, 8, 4096))))
    return "garbage appended"
  if kind == "not_utf8":
    data = _read(path)
    at = rng.randrange(max(1, len(data)))
    _write(path, data[:at] + b"\xff\xfe\xc3\x28" + data[at:])
    return f"bytes that are not UTF-8 inserted at {at}"
  os.remove(path)
  os.mkdir(path)
  return "replaced by a directory"


# -- JSON -------------------------------------------------------------------------------------------------------------


def _paths(value: Any, prefix: tuple = (), depth: int = 8) -> list[tuple]:
  """Every path to a node of a JSON value (the root excluded), as tuples of keys and indices."""
  found = []
  if depth == 0:
    return found
  items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
  for key, child in items:
    found.append(prefix + (key,))
    found.extend(_paths(child, prefix + (key,), depth - 1))
  return found


def _get(value: Any, path: tuple) -> Any:
  for key in path:
    value = value[key]
  return value


def _retyped(value: Any, rng: random.Random) -> Any:
  """The value in another JSON type: wrapped in a list, spelled as a string, a number made a float, or made an
  object."""
  choices: list[Callable[[], Any]] = [lambda: [value], lambda: json.dumps(value), lambda: {"value": value}]
  if isinstance(value, bool):
    choices.append(lambda: int(value))
  elif isinstance(value, int):
    choices.append(lambda: float(value) + 0.5)
  elif isinstance(value, list):
    choices.append(lambda: dict(enumerate(map(str, value))))
  elif isinstance(value, dict):
    choices.append(lambda: list(value.items()))
  return rng.choice(choices)()


def mutate_json(value: Any, rng: random.Random, *, focus: tuple[str, ...] = (),
                within: tuple = ()) -> tuple[Any, str]:
  """`value` with one node changed: deleted, replaced by a hostile value, retyped, set to an absurd size, nested a
  level deeper or renamed. With `focus`, nodes whose key is one of those are preferred; with `within`, only nodes
  below that path are changed (when it exists)."""
  if within:
    try:
      _get(value, within)
    except (KeyError, IndexError, TypeError):
      within = ()
  paths = [p for p in _paths(value) if p[: len(within)] == within and len(p) > len(within)]
  if not paths:
    return rng.choice(HOSTILE_VALUES), "whole value replaced"
  focused = [p for p in paths if p[-1] in focus]
  path = rng.choice(focused if focused and rng.random() < 0.6 else paths)
  parent, key = _get(value, path[:-1]), path[-1]
  old = parent[key]
  where = "/".join(map(str, path))
  kind = rng.choice(("delete", "hostile", "hostile", "retype", "absurd", "absurd", "nest", "rename"))
  if kind == "delete":
    del parent[key]
    return value, f"{where} deleted"
  if kind == "retype":
    parent[key] = _retyped(old, rng)
  elif kind == "absurd":
    parent[key] = rng.choice(ABSURD_SIZES)
  elif kind == "nest":
    parent[key] = {str(key): old}
  elif kind == "rename" and isinstance(parent, dict):
    del parent[key]
    parent[key.upper() if rng.random() < 0.5 else f"{key}_"] = old
    return value, f"{where} renamed"
  else:
    parent[key] = rng.choice(HOSTILE_VALUES)
  return value, f"{where}: {json.dumps(old)[:60]} -> {json.dumps(parent[key])[:60]}"


def claim_huge_size(value: dict, rng: random.Random, within: tuple = ()) -> str:
  """One of the sizes a config (the one at `within`) claims set huge; a config with none gets a layer count."""
  try:
    config = _get(value, within)
  except (KeyError, IndexError, TypeError):
    config = value
  keys = sorted(k for k in config if k in SIZE_KEYS) or ["num_hidden_layers"]
  layers = [k for k in keys if k in ("num_hidden_layers", "base_num_decoder_layers")]
  key = rng.choice(layers if layers and rng.random() < 0.5 else keys)  # The claim issue 59 saw take a host down.
  old, config[key] = config.get(key), rng.choice(HUGE_SIZES)
  return f"{'/'.join(map(str, within + (key,)))}: {old} -> {config[key]}"


def deeply_nested_json() -> bytes:
  return b"[" * NESTING_DEPTH + b"]" * NESTING_DEPTH


def damage_json_file(root: str, name: str, rng: random.Random, *, focus: tuple[str, ...] = (),
                     within: tuple = ()) -> str:
  """A JSON file's content changed (mostly one node; sometimes the whole text: not JSON, NaN, deep nesting, a
  list where an object belongs) or the file damaged as bytes."""
  path = os.path.join(root, name)
  roll = rng.random()
  if roll < 0.65:
    value, what = mutate_json(json.loads(_read(path)), rng, focus=focus, within=within)
    _write(path, json.dumps(value).encode())
    return what
  if roll < 0.8:
    kind = rng.choice(("deep", "not_json", "nan", "list", "null", "duplicate_keys"))
    data = _read(path)
    text = {"deep": deeply_nested_json(), "not_json": data[: len(data) // 2] + b"}{", "nan": b'{"value": NaN}',
            "list": b"[" + data + b"]", "null": b"null",
            "duplicate_keys": data.replace(b"{", b'{"x": 1, "x": {}, ', 1)}[kind]
    _write(path, text)
    return f"content replaced ({kind})"
  return damage_bytes(root, name, rng)


def _claim_in_json(root: str, name: str, rng: random.Random, within: tuple = ()) -> str:
  path = os.path.join(root, name)
  value = json.loads(_read(path))
  detail = claim_huge_size(value, rng, within)
  _write(path, json.dumps(value).encode())
  return detail


# -- safetensors ------------------------------------------------------------------------------------------------------


def read_safetensors_header(path: str) -> tuple[dict, int]:
  """The header JSON and the offset where the data starts."""
  data = _read(path)
  (length,) = struct.unpack("<Q", data[:8])
  return json.loads(data[8: 8 + length]), 8 + length


def _rewrite_header(path: str, header: Any, data_start: int) -> None:
  encoded = json.dumps(header).encode()
  encoded += b" " * (-len(encoded) % 8)
  data = _read(path)
  _write(path, struct.pack("<Q", len(encoded)) + encoded + data[data_start:])


def damage_safetensors(root: str, name: str, rng: random.Random) -> tuple[str, str]:
  """(kind, detail) of one change to a safetensors file: its header length, header JSON (a tensor's dtype, shape
  or byte range, an entry deleted, any node), header bytes, truncation, or flips in its tensor data."""
  path = os.path.join(root, name)
  header, data_start = read_safetensors_header(path)
  size = os.path.getsize(path)
  tensors = sorted(k for k in header if k != "__metadata__")
  kind = rng.choice(("header_length", "dtype", "shape", "data_offsets", "entry", "header_json", "header_bytes",
                     "truncate", "data_flips", "data_flips"))
  if kind == "header_length":
    length = rng.choice((0, 1, data_start - 9, data_start - 7, size, size - 7, 2**63 - 1, 2**64 - 1, 2**31))
    with open(path, "r+b") as f:
      f.write(struct.pack("<Q", max(0, length)))
    return kind, f"header length {data_start - 8} -> {max(0, length)}"
  if kind in ("dtype", "shape", "data_offsets", "entry") and tensors:
    tensor = rng.choice(tensors)
    entry = header[tensor]
    if kind == "dtype":
      old, entry["dtype"] = entry["dtype"], rng.choice(SAFETENSORS_DTYPE_CODES + (None, 3, ["F32"]))
      detail = f"{tensor} dtype {old} -> {entry['dtype']}"
    elif kind == "shape":
      old = list(entry["shape"])
      entry["shape"] = rng.choice([
          [d + 1 for d in old], old[:-1], old + [1], [2**40] + old[1:], [-1] + old[1:], [], "x", None,
          list(reversed(old)), [d * 2 for d in old], [2**31] * max(1, len(old))])
      detail = f"{tensor} shape {old} -> {entry['shape']}"
    elif kind == "data_offsets":
      begin, end = entry["data_offsets"]
      entry["data_offsets"] = rng.choice([
          [end, begin], [begin, end + 1], [begin, size * 2], [begin - 1, end - 1], [begin + 2, end + 2], [0, end],
          [begin], [-8, end], [begin, 2**64], [str(begin), end], None, [begin, begin]])
      detail = f"{tensor} data_offsets {[begin, end]} -> {entry['data_offsets']}"
    else:
      if rng.random() < 0.5:
        del header[tensor]
        detail = f"{tensor} entry deleted"
      else:
        header[tensor + ".extra"] = dict(entry)
        detail = f"{tensor} entry duplicated under another name"
    _rewrite_header(path, header, data_start)
    return kind, detail
  if kind == "header_json":
    header, detail = mutate_json(header, rng, focus=("dtype", "shape", "data_offsets", "__metadata__"))
    _rewrite_header(path, header, data_start)
    return kind, detail
  if kind == "header_bytes":
    roll = rng.random()
    if roll < 0.3:
      nested = deeply_nested_json()
      data = _read(path)
      _write(path, struct.pack("<Q", len(nested)) + nested + data[data_start:])
      return kind, "header replaced by deeply nested JSON"
    if roll < 0.45:
      data = bytearray(_read(path))
      data[8:12] = b"\xff\xfe\xc3\x28"
      _write(path, bytes(data))
      return kind, "header bytes that are not UTF-8"
    return kind, flip_bits(path, rng, 8, data_start)
  if kind == "truncate" or data_start >= size:
    return "truncate", truncate(path, rng)
  return kind, flip_bits(path, rng, data_start, size)


# -- the inputs -------------------------------------------------------------------------------------------------------


def _files(root: str) -> list[str]:
  """Every file under `root`, relative to it, sorted."""
  return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def damage_huggingface(root: str, rng: random.Random) -> Damage:
  """One change to the HF checkpoint directory `root` (config.json + safetensors, maybe an index)."""
  files = _files(root)
  shards = [f for f in files if f.endswith(".safetensors")]
  index = next((f for f in files if f.endswith(".safetensors.index.json")), None)
  roll = rng.random()
  if roll < 0.08:
    return Damage("config.json", "config_size", _claim_in_json(root, "config.json", rng))
  if roll < 0.3:
    return Damage("config.json", "config", damage_json_file(root, "config.json", rng, focus=CONFIG_KEYS))
  if roll < 0.45 and index:
    return Damage(index, "index", damage_index(root, index, shards, rng))
  if roll < 0.9:
    shard = rng.choice(shards)
    kind, detail = damage_safetensors(root, shard, rng)
    return Damage(shard, f"safetensors_{kind}", detail)
  name = rng.choice(files)
  return Damage(name, "file", damage_bytes(root, name, rng))


def damage_index(root: str, name: str, shards: list[str], rng: random.Random) -> str:
  """The index's weight_map of the wrong type, its values wrong (another shard, a missing file, a path out of the
  directory, not a string), an entry dropped or invented, or the file damaged as JSON or bytes."""
  path = os.path.join(root, name)
  index = json.loads(_read(path))
  weight_map = index["weight_map"]
  kind = rng.choice(("weight_map_type", "value", "value", "drop", "invent", "total_size", "file"))
  if kind == "weight_map_type":
    index["weight_map"] = rng.choice((None, [], list(weight_map.items()), "model.safetensors", 3, {}))
    detail = f"weight_map -> {json.dumps(index['weight_map'])[:60]}"
  elif kind == "value":
    tensor = rng.choice(sorted(weight_map))
    weight_map[tensor] = rng.choice(shards + [None, 3, [shards[0]], "missing.safetensors", "../model.safetensors",
                                              "/etc/passwd", "", ".", "config.json", {"file": shards[0]}])
    detail = f"weight_map[{tensor}] -> {json.dumps(weight_map[tensor])}"
  elif kind == "drop":
    tensor = rng.choice(sorted(weight_map))
    del weight_map[tensor]
    detail = f"weight_map[{tensor}] dropped"
  elif kind == "invent":
    weight_map["model.layers.999.mlp.gate_proj.weight"] = rng.choice(shards)
    detail = "weight_map names a tensor no shard holds"
  elif kind == "total_size":
    index.setdefault("metadata", {})["total_size"] = rng.choice(ABSURD_SIZES + (None, "x"))
    detail = f"metadata.total_size -> {index['metadata']['total_size']}"
  else:
    return damage_json_file(root, name, rng, focus=("weight_map",))
  _write(path, json.dumps(index).encode())
  return detail


RECORD_PATH = ("custom_metadata", "hf2maxtext")


def damage_maxtext(root: str, items: str, rng: random.Random) -> Damage:
  """One change to the converted checkpoint under `root` whose items directory is `items` (relative to `root`):
  the step's _CHECKPOINT_METADATA (most often its conversion record), the tree's _METADATA, an OCDBT manifest or
  data file, an array's zarr.json inside the database, or the commit markers."""
  step = os.path.dirname(items)
  files = _files(root)
  data_files = [f for f in files if f"{os.sep}d{os.sep}" in f]
  manifests = [f for f in files if f.endswith("manifest.ocdbt")]
  roll = rng.random()
  if roll < 0.07:
    name = os.path.join(step, "_CHECKPOINT_METADATA")
    within = RECORD_PATH + rng.choice((("hf_config",), ("maxtext_overrides",)))
    return Damage(name, "record_size", _claim_in_json(root, name, rng, within))
  if roll < 0.25:
    name = os.path.join(step, "_CHECKPOINT_METADATA")
    within = RECORD_PATH if rng.random() < 0.8 else ()
    focus = CONFIG_KEYS + ("family", "target_model", "save_dtype", "scan_layers", "logical_axes", "chunking",
                           "maxtext_overrides", "hf_config", "base_num_decoder_layers", "fp8", "quant_method")
    return Damage(name, "checkpoint_metadata", damage_json_file(root, name, rng, focus=focus, within=within))
  if roll < 0.4:
    name = os.path.join(items, "_METADATA")
    return Damage(name, "tree_metadata", damage_json_file(root, name, rng), stored_values=True)
  if roll < 0.5:
    name = rng.choice(manifests)
    return Damage(name, "ocdbt_manifest", damage_bytes(root, name, rng), stored_values=True)
  if roll < 0.8:
    # Sorted by size: the n-th file is the same one in every build of the same model (OCDBT names them at random).
    data_files.sort(key=lambda f: (os.path.getsize(os.path.join(root, f)), f))
    name = rng.choice(data_files)
    return Damage(name, "ocdbt_data", damage_bytes(root, name, rng), stored_values=True)
  if roll < 0.92:
    key, detail = damage_array_metadata(os.path.join(root, items), rng)
    return Damage(os.path.join(items, key), "array_metadata", detail, stored_values=True)
  if rng.random() < 0.5:
    markers = [f for f in files if os.path.basename(f) == "commit_success.txt"]
    for marker in markers:
      os.remove(os.path.join(root, marker))
    return Damage(step, "commit_markers", f"{len(markers)} commit markers deleted (a local step's rename commits it)")
  # As a killed save leaves a step on a local disk: never renamed into place.
  uncommitted = f"{step}.orbax-checkpoint-tmp-{rng.randrange(10**9)}"
  os.rename(os.path.join(root, step), os.path.join(root, uncommitted))
  return Damage(uncommitted, "uncommitted", f"{step} never renamed into place", must_refuse=True)


def damage_array_metadata(items_dir: str, rng: random.Random) -> tuple[str, str]:
  """An array's zarr.json (a key in the items' OCDBT database) changed: its shape, data type, chunk shape, codecs
  or fill value, any node, or its text. Through TensorStore, which starts threads: call it in the trial's child."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top

  store = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{items_dir}"}).result()
  keys = sorted(k.decode() for k in store.list().result() if k.endswith(b"zarr.json") and not k.startswith(b"step"))
  key = rng.choice(keys)
  meta = json.loads(store.read(key).result().value)
  kind = rng.choice(("shape", "data_type", "chunk_shape", "codecs", "fill_value", "node", "text"))
  if kind == "shape":
    old, meta["shape"] = meta["shape"], rng.choice([[d + 1 for d in meta["shape"]], meta["shape"][:-1],
                                                    meta["shape"] + [2], [2**40] * len(meta["shape"]), [-1], []])
    detail = f"shape {old} -> {meta['shape']}"
  elif kind == "data_type":
    old, meta["data_type"] = meta["data_type"], rng.choice(ZARR_DATA_TYPES)
    detail = f"data_type {old} -> {meta['data_type']}"
  elif kind == "chunk_shape":
    grid = meta["chunk_grid"]["configuration"]
    old = grid["chunk_shape"]
    grid["chunk_shape"] = rng.choice([[1] * len(old), [d * 2 for d in old], [0] * len(old), old[:-1], [2**31] * len(old)])
    detail = f"chunk_shape {old} -> {grid['chunk_shape']}"
  elif kind == "codecs":
    meta["codecs"] = rng.choice([[], [{"name": "bytes", "configuration": {"endian": "big"}}],
                                 [{"name": "zstd"}], meta["codecs"] * 2, None])
    detail = f"codecs -> {json.dumps(meta['codecs'])[:80]}"
  elif kind == "fill_value":
    meta["fill_value"] = rng.choice((1.0, "NaN", None, "x", [0]))
    detail = f"fill_value -> {meta['fill_value']}"
  elif kind == "node":
    meta, detail = mutate_json(meta, rng)
  else:
    store.write(key, b"{" + json.dumps(meta).encode()[: rng.randrange(1, 40)]).result()
    return key, "text cut"
  store.write(key, json.dumps(meta).encode()).result()
  return key, detail


def copy_tree(source: str, destination: str) -> None:
  shutil.copytree(source, destination, symlinks=True)
