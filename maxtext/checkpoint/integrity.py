"""Checksum manifests: detect truncated, missing or altered checkpoint files.

Orbax makes a checkpoint visible only once it is complete (it writes into
`<step>.orbax-checkpoint-tmp` and renames the folder at the end), but nothing
in it notices a file that is later truncated, deleted or has bytes flipped:
such a checkpoint may fail to restore or, worse, restore wrong numbers.

`write_manifest(step_dir)` records the size and SHA-256 of every file of a
finished checkpoint folder in `<step_dir>/maxtext_manifest.json` (written
atomically: a temporary file, fsync, rename). `check(step_dir)` compares the
folder against it before anything in the folder is parsed, so a tampered file
is rejected unopened. A folder without a valid manifest counts as corrupt.
Files added after the manifest was written, and Orbax's step metadata
(`UNCHECKED_FILES`, rewritten after the commit), are not checked.

Cost: writing and checking each read the whole checkpoint once (hashing runs
on several threads; SHA-256 is about 1-2 GB/s per core).
"""

from collections.abc import Sequence
import concurrent.futures
import hashlib
import json
import os

from maxtext.common import json_file

MANIFEST_FILENAME = "maxtext_manifest.json"
# Orbax rewrites the step metadata (timestamps) after the commit; it is not
# covered by the manifest.
UNCHECKED_FILES = ("_CHECKPOINT_METADATA",)
_FORMAT_VERSION = 1
_HASH_THREADS = 8


def _files(step_dir: str) -> list[str]:
  """Paths of every file under `step_dir`, relative to it, sorted."""
  out = []
  for root, _, names in os.walk(step_dir):
    for name in names:
      path = os.path.relpath(os.path.join(root, name), step_dir)
      if path != MANIFEST_FILENAME and path not in UNCHECKED_FILES:
        out.append(path)
  return sorted(out)


def _sha256(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


def _try_sha256(path: str) -> str | OSError:
  """`path`'s SHA-256, or the error that kept it from being read."""
  try:
    return _sha256(path)
  except OSError as e:
    return e


def _hash_all(step_dir: str, names: Sequence[str], digest=_sha256) -> list:
  """`digest` of each of `names` under `step_dir`, on several threads."""
  with concurrent.futures.ThreadPoolExecutor(_HASH_THREADS) as pool:
    return list(pool.map(lambda n: digest(os.path.join(step_dir, n)), names))


def write_manifest(step_dir: str) -> str:
  """Hashes every file of `step_dir` into its manifest; returns its path."""
  names = _files(step_dir)
  digests = _hash_all(step_dir, names)
  files = {name: {"size": os.path.getsize(os.path.join(step_dir, name)),
                  "sha256": digest} for name, digest in zip(names, digests)}
  path = os.path.join(step_dir, MANIFEST_FILENAME)
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump({"version": _FORMAT_VERSION, "files": files}, f, indent=1)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  return path


def read_manifest(step_dir: str) -> dict[str, dict[str, object]]:
  """The manifest's {relative path: {"size", "sha256"}}.

  Raises:
    ValueError: the manifest is missing or unreadable.
  """
  path = os.path.join(step_dir, MANIFEST_FILENAME)
  if not os.path.lexists(path):
    raise ValueError(f"{MANIFEST_FILENAME} is missing")
  try:
    manifest = json_file.read_object(path, name=MANIFEST_FILENAME)
  except json_file.JsonFileError as e:
    raise ValueError(str(e).rstrip(".")) from e
  files = manifest.get("files")
  if (manifest.get("version") != _FORMAT_VERSION or
      not isinstance(files, dict) or not files or
      not all(isinstance(entry, dict) for entry in files.values())):
    raise ValueError(
        f"{MANIFEST_FILENAME} is not a version-{_FORMAT_VERSION} manifest")
  outside = sorted(name for name in files
                   if os.path.isabs(name) or os.path.normpath(name) != name
                   or name.split(os.sep)[0] == os.pardir)
  if outside:
    raise ValueError(f"{MANIFEST_FILENAME} names files outside its folder:"
                     f" {outside[:3]}")
  return files


def check(step_dir: str, *, shard_index: int = 0,
          shard_count: int = 1) -> list[str]:
  """Problems of `step_dir` against its manifest; empty when it is intact.

  Args:
    step_dir: A checkpoint folder.
    shard_index: With `shard_count`, check only every `shard_count`-th file
      starting at this one (processes of a multi-host job split the work).
    shard_count: Number of shards.

  Returns:
    One line per bad file: missing, not a file, wrong size, unreadable or
    wrong checksum; or the manifest's own problem (missing, unreadable, or
    naming files outside `step_dir`).
  """
  try:
    files = read_manifest(step_dir)
  except ValueError as e:
    return [str(e)]
  names = sorted(files)[shard_index::shard_count]
  problems = []
  present = []
  for name in names:
    path = os.path.join(step_dir, name)
    if not os.path.lexists(path):
      problems.append(f"{name}: missing")
    elif not os.path.isfile(path):  # A folder, a device, a dangling link.
      problems.append(f"{name}: not a regular file")
    elif os.path.getsize(path) != files[name].get("size"):
      problems.append(f"{name}: {os.path.getsize(path)} bytes, the manifest"
                      f" says {files[name].get('size')} (truncated or"
                      " overwritten)")
    else:
      present.append(name)
  for name, digest in zip(present, _hash_all(step_dir, present, _try_sha256)):
    if isinstance(digest, OSError):
      problems.append(f"{name}: cannot be read ({digest.strerror or digest})")
    elif digest != files[name].get("sha256"):
      problems.append(f"{name}: SHA-256 differs from the manifest (bytes"
                      " altered)")
  return sorted(problems)


def summary(problems: Sequence[str], shown: int = 5) -> str:
  """`check`'s problems on one line: the first `shown`, and how many more."""
  more = len(problems) - shown
  return "; ".join(problems[:shown]) + (f" (and {more} more)" if more > 0
                                        else "")
