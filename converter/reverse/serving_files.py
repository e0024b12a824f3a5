"""What a serving stack reads from a model directory besides the weights and config.json, copied from the original
model on the way back so that the output serves on its own.

transformers' `AutoTokenizer` / `AutoProcessor` / `pipeline`, vLLM and SGLang read the tokenizer (`tokenizer.json`,
`tokenizer_config.json`, `special_tokens_map.json`, `tokenizer.model`, `vocab.json` / `merges.txt`, `tiktoken.model`
and the remote code that reads it), the chat template (`chat_template.jinja`), `generation_config.json` and, for
multimodal models, the processor and preprocessor configs. They are copied byte for byte: every top-level file of
the original except its weights, their index and config.json (which the conversion writes), so whatever else the
original carries (a licence, remote code, an audio feature extractor's config) travels with the weights too.

The original is where the conversion to MaxText read it (recorded in the checkpoint) or `--hf_config_path`'s
directory: a local directory, a bucket, or a Hub repo id at its revision (only those files are fetched).
"""

from __future__ import annotations

from absl import logging

from converter import storage
from converter.storage import hub
from converter.checkpoint_format.original import Original
from converter.errors import ConversionError

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx", ".npz")
# hf_quant_config.json: a quantized original's (ModelOpt) description of its weights, which vLLM would apply to the
# dequantized ones written back.
NOT_COPIED = frozenset({"config.json", ".gitattributes", "hf_quant_config.json"})
# What a serving stack cannot do without: named when the original has none of them.
EXPECTED = ("tokenizer_config.json", "generation_config.json")
MAX_FILE_BYTES = 256 << 20  # Larger top-level files are not what a server reads (a consolidated weights dump).
# Fetched from the Hub's cache by name when the Hub cannot be listed (HF_HUB_OFFLINE).
KNOWN = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
         "merges.txt", "vocab.txt", "added_tokens.json", "tiktoken.model", "chat_template.jinja", "chat_template.json",
         "generation_config.json", "preprocessor_config.json", "processor_config.json",
         "video_preprocessor_config.json")


def is_served(name: str) -> bool:
  """Whether a top-level file of the original is copied: anything but weights, their index and config.json."""
  return name not in NOT_COPIED and not name.endswith(WEIGHT_SUFFIXES + (".index.json",)) and not name.startswith(".")


def _hub_files(original: Original) -> dict[str, str]:
  """The repo's top-level serving files, each fetched into the local HF cache (or found there); with
  HF_HUB_OFFLINE, the `KNOWN` ones the cache holds."""
  import huggingface_hub  # pylint: disable=g-import-not-at-top
  from huggingface_hub import constants, errors  # pylint: disable=g-import-not-at-top

  repo, revision = original.location, original.revision
  try:
    if constants.HF_HUB_OFFLINE:
      cached = {n: huggingface_hub.try_to_load_from_cache(repo, n, revision=revision) for n in KNOWN}
      return {n: path for n, path in cached.items() if isinstance(path, str)}
    names = [n for n in huggingface_hub.list_repo_files(repo, revision=revision) if "/" not in n and is_served(n)]
    return {n: huggingface_hub.hf_hub_download(repo, n, revision=revision) for n in names}
  except (errors.HfHubHTTPError, OSError, ValueError) as e:
    raise hub.error(original.describe(), e, "fetching the original's tokenizer and serving files") from e


def read_serving_files(original: Original) -> dict[str, bytes]:
  """Every serving file of `original`, by name, as bytes."""
  if original.on_hub:
    paths = _hub_files(original)
  elif not storage.exists(original.location):
    raise ConversionError(f"{original.location}: the original model is not there (moved or deleted since the"
                          " conversion to MaxText read it)")
  else:
    paths = {n: storage.join(original.location, n) for n in storage.list_names(original.location) if is_served(n)}
    paths = {n: p for n, p in paths.items() if storage.is_file(p)}
  files = {}
  for name, path in sorted(paths.items()):
    size = storage.size(path)
    if size > MAX_FILE_BYTES:
      logging.warning("%s: %s is %d MiB; not copied (not a file a server reads besides the weights)",
                      original.describe(), name, size >> 20)
      continue
    try:
      files[name] = storage.read_bytes(path)
    except OSError as e:
      raise ConversionError(f"{path}: cannot read the original's {name}: {e}") from e
  return files


def missing(files: dict[str, bytes]) -> list[str]:
  """The files a serving stack needs that `files` lacks: a tokenizer (any of its forms) and the expected ones."""
  wanted = [n for n in EXPECTED if n not in files]
  if not {"tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model", "vocab.txt"} & set(files):
    wanted.insert(0, "tokenizer.json (or tokenizer.model, vocab.json + merges.txt)")
  return wanted
