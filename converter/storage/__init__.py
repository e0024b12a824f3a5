"""Where checkpoints live: local paths, buckets (`gs://`, `s3://`) and the Hub's files (`hf://ORG/NAME@COMMIT/FILE`,
read only: storage/hub.py) behind one small set of calls.

Tensor bytes in a bucket are read with tensorstore's kvstore, a ranged read of only the bytes a block needs (C++,
no GIL, many in flight; the same client Orbax's array writes use); everything else (config files, headers, what
Orbax does with directories, metadata and its commit) goes through etils.epath, which reaches buckets through
gcsfs. One environment variable points all of them at an emulator: STORAGE_EMULATOR_HOST, the convention of
Google's clients and gcsfs, which `configure_emulator` translates for tensorstore. A Hub file complete in the local
HF cache is that local file; the Hub's weights are read by HTTP range requests (hub.py).
"""

from __future__ import annotations

import os
import posixpath
import threading
from typing import Any

import numpy as np

from converter import write_behind
from converter.errors import ConversionError
from converter.storage import hub, mapped_file, ranged_file

REMOTE_SCHEMES = ("gs://", "s3://")  # s3:// is refused by `resolve` (see there).


def is_remote(path: str) -> bool:
  """A bucket path (the Hub's files are not: see `is_url`)."""
  return path.startswith(REMOTE_SCHEMES)


def is_url(path: str) -> bool:
  """A bucket path or a Hub file: named with slashes whatever the OS."""
  return is_remote(path) or hub.is_hub(path)


def _hub_local(path: str) -> str | None:
  """A Hub file's local copy (the HF cache's), or None: read by ranges, or not in the repo."""
  return hub.local_copy(path) if hub.is_hub(path) else None


def resolve(path: str) -> str:
  """A flag's path: buckets as given (no trailing slash); local paths absolute, relative ones to where the user ran
  `bazel run` (not Bazel's runfiles directory)."""
  if path.startswith("s3://"):
    raise ConversionError(f"{path}: s3:// is not supported (tensorstore could read it, but Orbax's paths need"
                          " s3fs, which is neither pinned nor tested here); copy the checkpoint to gs:// or a disk")
  if path.startswith("hf://"):
    return path  # A Hub repo (converter/output/hub_repo.py), an output of the way back.
  if is_remote(path):
    scheme, rest = path.split("://", 1)
    rest = posixpath.normpath(rest).lstrip("/") if rest.strip("/") else ""
    if not rest:
      raise ConversionError(f"{path}: names no bucket")
    return f"{scheme}://{rest}"
  base = os.environ.get("BUILD_WORKING_DIRECTORY", os.getcwd())
  return os.path.abspath(os.path.join(base, os.path.expanduser(path)))


def join(path: str, *names: str) -> str:
  return posixpath.join(path, *names) if is_url(path) else os.path.join(path, *names)


def parent(path: str) -> str:
  return posixpath.dirname(path.rstrip("/")) if is_url(path) else os.path.dirname(path)


def basename(path: str) -> str:
  return posixpath.basename(path.rstrip("/")) if is_url(path) else os.path.basename(path)


def split_bucket(path: str) -> tuple[str, str, str]:
  """("gs", bucket, object name) of a bucket path."""
  scheme, rest = path.split("://", 1)
  bucket, _, name = rest.partition("/")
  return scheme, bucket, name


def kvstore_spec(path: str) -> dict[str, Any]:
  """The tensorstore kvstore spec of a file or directory, as Orbax builds its own: the file driver for a local
  path; for a gs:// path the driver TENSORSTORE_GCS_BACKEND names ("gcs" unless set), Orbax's own switch, so that a
  checkpoint is read through the client it was written with. The path is normalised (no trailing slash, `.` or
  `..`). Refused: a relative local path (tensorstore would resolve it against the working directory, which under
  `bazel run` is not the user's: see `resolve`), and any other scheme."""
  if not is_remote(path):
    if not os.path.isabs(path):
      raise ConversionError(f"{path}: a checkpoint path must be absolute here")
    return {"driver": "file", "path": os.path.normpath(path)}
  scheme, bucket, name = split_bucket(path)
  if scheme != "gs":
    raise ConversionError(f"{path}: Orbax checkpoints are read from gs:// buckets or local disks only")
  return {"driver": os.environ.get("TENSORSTORE_GCS_BACKEND", "gcs"), "bucket": bucket,
          "path": posixpath.normpath(name).rstrip("/") if name else ""}


def configure_emulator(environ: dict[str, str] | Any = os.environ) -> None:
  """With STORAGE_EMULATOR_HOST set, points tensorstore at the same endpoint (it reads its own variables), with a
  placeholder token, and turns off gcsfs' gRPC bucket-layout lookup, which against a plain-http emulator waits
  60 s per call before falling back. Variables already set are left alone."""
  host = environ.get("STORAGE_EMULATOR_HOST")
  if not host:
    return
  url = host if "://" in host else f"http://{host}"
  environ.setdefault("TENSORSTORE_GCS_HTTP_URL", url)
  environ.setdefault("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")
  environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


_retries = {"max_retries": 10, "initial_delay": "1s", "max_delay": "32s"}


def set_request_retries(max_retries: int) -> None:
  """How often one request to a bucket or the Hub is retried (backing off from 1 s, doubling, up to 32 s) before
  the conversion fails: 10 rides out about three minutes of outage."""
  _retries["max_retries"] = max_retries
  hub.configure(max_retries=max_retries)


def tensorstore_resources() -> dict[str, Any]:
  """The tensorstore context resources that apply the retry policy to GCS and S3 requests."""
  return {"gcs_request_retries": dict(_retries), "s3_request_retries": dict(_retries)}


def epath_of(path: str):
  from etils import epath  # pylint: disable=g-import-not-at-top

  return epath.Path(path)


def remote_error(path: str, e: BaseException, doing: str) -> ConversionError:
  """An error naming the bucket and object, with the reason in the user's words where it is recognisable."""
  scheme, bucket, name = split_bucket(path)
  text = f"{type(e).__name__}: {e}"
  lowered = text.lower()
  if "bucket" in lowered and ("not found" in lowered or "does not exist" in lowered or "404" in lowered):
    why = f"bucket {scheme}://{bucket} does not exist"
  elif "403" in lowered or "permission" in lowered or "forbidden" in lowered:
    why = f"permission denied on {scheme}://{bucket}"
  elif "401" in lowered or "credential" in lowered or "unauthenticated" in lowered:
    why = f"no valid credentials for {scheme}://{bucket} (gcloud auth application-default login)"
  elif isinstance(e, FileNotFoundError) or "not found" in lowered or "404" in lowered:
    why = f"object {name!r} not found in bucket {scheme}://{bucket}"
  else:
    why = text
  return ConversionError(f"{path}: {doing} failed: {why}")


def exists(path: str) -> bool:
  if hub.is_hub(path):
    return hub.exists(path)
  if not is_remote(path):
    return os.path.exists(path)
  try:
    return epath_of(path).exists()
  except Exception as e:  # gcsfs raises assorted types for a missing bucket or bad credentials.
    raise remote_error(path, e, "checking") from e


def is_file(path: str) -> bool:
  if hub.is_hub(path):
    return bool(hub.parse(path).filename) and hub.exists(path)
  if not is_remote(path):
    return os.path.isfile(path)
  try:
    return epath_of(path).is_file()
  except Exception as e:  # pylint: disable=broad-except
    raise remote_error(path, e, "checking") from e


def read_text(path: str) -> str:
  path = _hub_local(path) or path
  if not is_url(path):
    with open(path, encoding="utf-8") as f:
      return f.read()
  return read_bytes(path).decode("utf-8")


def write_text(path: str, text: str) -> None:
  """A small file, or an object written in one request under the retry policy (`set_request_retries`)."""
  write_bytes(path, text.encode("utf-8"))


def write_bytes(path: str, data: bytes) -> None:
  """A small file, or an object written in one request under the retry policy (`set_request_retries`)."""
  if not is_remote(path):
    with open(path, "wb") as f:
      f.write(data)
    return
  scheme, bucket, name = split_bucket(path)
  try:
    _kvstore(scheme, bucket).write(name, data).result()
  except Exception as e:  # pylint: disable=broad-except
    raise remote_error(path, e, "writing") from e


def delete(path: str) -> None:
  """Deletes one file or object (nothing when it is not there), under the retry policy."""
  if not is_remote(path):
    try:
      os.remove(path)
    except FileNotFoundError:
      pass
    return
  scheme, bucket, name = split_bucket(path)
  try:
    _kvstore(scheme, bucket).write(name, None).result()
  except Exception as e:  # pylint: disable=broad-except
    raise remote_error(path, e, "deleting") from e


def size(path: str) -> int:
  if hub.is_hub(path):
    return hub.size(path)
  if not is_remote(path):
    return os.path.getsize(path)
  try:
    return int(epath_of(path).stat().length)
  except Exception as e:  # pylint: disable=broad-except
    check_bucket(path)  # A missing bucket is named as such (gcsfs says only that the object is not found).
    raise remote_error(path, e, "reading the size of") from e


def version(path: str) -> str:
  """What changes when the file is rewritten: mtime (local), the object's mtime (bucket), the commit and ETag (Hub)."""
  if hub.is_hub(path):
    return hub.version(path)
  if not is_remote(path):
    return str(os.stat(path).st_mtime_ns)
  try:
    return str(epath_of(path).stat().mtime)
  except Exception as e:  # pylint: disable=broad-except
    raise remote_error(path, e, "reading the metadata of") from e


_stores: dict[tuple[str, str], Any] = {}
_stores_lock = threading.Lock()


def _kvstore(scheme: str, bucket: str):
  key = (scheme, bucket)
  store = _stores.get(key)
  if store is None:
    import tensorstore as ts  # pylint: disable=g-import-not-at-top

    with _stores_lock:
      store = _stores.get(key)
      if store is None:
        driver = {"gs": "gcs", "s3": "s3"}[scheme]
        store = ts.KvStore.open({"driver": driver, "bucket": bucket},
                                context=ts.Context(tensorstore_resources())).result()
        _stores[key] = store
  return store


def read_bytes(path: str, start: int = 0, stop: int | None = None) -> bytes:
  """Bytes [start, stop) of a file or object (the rest of it when `stop` is None); a bucket object is read with
  one ranged request, a Hub file's with ranged requests in parallel parts."""
  path = _hub_local(path) or path
  if hub.is_hub(path):
    return hub.read_bytes(path, start, stop)
  if not is_remote(path):
    with open(path, "rb") as f:
      f.seek(start)
      return f.read(-1 if stop is None else stop - start)
  scheme, bucket, name = split_bucket(path)
  try:
    result = _kvstore(scheme, bucket).read(name, byte_range=slice(start, stop)).result()
  except Exception as e:  # tensorstore raises ValueError with its own status text.
    raise remote_error(path, e, f"reading bytes {start}-{stop if stop is not None else 'end'}") from e
  if result.state != "value":
    check_bucket(path)  # A missing bucket is named as such.
    raise remote_error(path, FileNotFoundError("not found"), "reading")
  return result.value



def read_span(path: str, start: int, stop: int) -> np.ndarray:
  """Bytes [start, stop) of a bucket object or a Hub file as a uint8 array (a tensor region's: ranged_file.py)."""
  if hub.is_hub(path):
    return hub.read_array(path, start, stop)
  return np.frombuffer(read_bytes(path, start, stop), np.uint8)


def read_overhead_bytes(path: str) -> int:
  """What reading a checkpoint at `path` holds besides the blocks read (its connections, their threads), per
  process: what `--dry_run` adds for it."""
  return hub.READ_OVERHEAD_BYTES if hub.is_hub(path) else 0


def read_region(path: str, begin: int, stored: np.dtype, shape: tuple[int, ...], slices: tuple[slice, ...],
                span: tuple[int, int], dtype: np.dtype, transpose: bool = False) -> np.ndarray:
  """A C-ordered private copy of `[slices]` of the tensor stored at byte `begin` of `path`, cast to `dtype`
  (`span`: the absolute byte range the slices touch; `transpose` swaps the last two axes as it copies): through a
  memory map of a local file (mapped_file.py), or ranged requests to a bucket or the Hub (ranged_file.py)."""
  path = _hub_local(path) or path
  reader = ranged_file if is_url(path) else mapped_file
  return reader.read(path, begin, stored, shape, slices, span, dtype, transpose=transpose)


def read_ahead(path: str, begin: int, end: int) -> None:
  """Asks for bytes [begin, end) of `path` to be fetched now, in the background, for a read that comes later: the
  kernel's readahead of a local file (nothing waits for it, nothing is kept in this process); a no-op for a
  bucket object or a Hub file, whose ranged requests are made when read."""
  path = _hub_local(path) or path
  if is_url(path) or end <= begin:
    return
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return  # Only a hint: the read itself reports a missing file, naming the tensor.
  try:
    os.posix_fadvise(fd, begin, end - begin, os.POSIX_FADV_WILLNEED)
  except (OSError, AttributeError):
    pass
  finally:
    os.close(fd)


def filesystem(path: str, **options: Any):
  """gcsfs (or s3fs) for a bucket path: directory operations Orbax's epath does not offer. `version_aware=True`
  makes `PATH#GENERATION` name one generation of an object (a delete then applies only to that generation)."""
  import fsspec  # pylint: disable=g-import-not-at-top

  return fsspec.filesystem(split_bucket(path)[0], **options)


def check_bucket(path: str) -> None:
  """Raises, naming the bucket, when it does not exist or cannot be listed."""
  scheme, bucket, _ = split_bucket(path)
  try:
    found = filesystem(path).exists(bucket)
  except Exception as e:  # pylint: disable=broad-except
    raise remote_error(path, e, "opening the bucket") from e
  if not found:
    raise ConversionError(f"{path}: bucket {scheme}://{bucket} does not exist (create it, or fix the path)")


def make_dirs(path: str) -> None:
  """A local directory and its parents; for a bucket (no directories) a check that the bucket exists."""
  if is_remote(path):
    check_bucket(path)
    return
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise ConversionError(f"{path}: cannot create directory: {e}") from e


def remove_tree(path: str) -> None:
  """Deletes a directory (a bucket prefix) and everything below it; nothing when it is not there."""
  if not is_remote(path):
    import shutil  # pylint: disable=g-import-not-at-top

    shutil.rmtree(path, ignore_errors=True)
    return
  fs = filesystem(path)
  try:
    if fs.exists(path):
      fs.rm(path, recursive=True)
  except FileNotFoundError:
    pass
  except Exception as e:  # pylint: disable=broad-except
    raise remote_error(path, e, "deleting") from e


def move(source: str, destination: str) -> None:
  """Renames a directory (local), or copies a prefix server-side and deletes the original (bucket)."""
  if not is_remote(source):
    os.replace(source, destination)
    return
  fs = filesystem(source)
  try:
    fs.mv(source, destination, recursive=True)
  except Exception as e:  # pylint: disable=broad-except
    raise remote_error(source, e, f"moving to {destination}") from e


def list_names(path: str) -> list[str]:
  """The names directly below a directory (a bucket prefix); [] when there is none."""
  if not is_remote(path):
    return sorted(os.listdir(path)) if os.path.isdir(path) else []
  fs = filesystem(path)
  try:
    return sorted(basename(p) for p in fs.ls(path, detail=False)) if fs.exists(path) else []
  except FileNotFoundError:
    return []
  except Exception as e:  # pylint: disable=broad-except
    raise remote_error(path, e, "listing") from e


def open_for_writing(path: str):
  """A binary file to stream into: local, written behind (converter/write_behind.py), or an object uploaded in
  parts as it is written (created on close)."""
  if not is_remote(path):
    return write_behind.WriteBehindFile(path)
  try:
    return filesystem(path).open(path, "wb")
  except Exception as e:  # pylint: disable=broad-except
    raise remote_error(path, e, "creating") from e
