"""Writes the BUILD file of a pip_lock_repository (see pip_repository.bzl).

One py_library per installed distribution: its data are the top-level
directories and files it alone owns under `site-packages/` (shared namespace folders
such as `google/` are split one level further), its deps are its
`Requires-Dist` entries whose markers hold for this interpreter, plus the
extra requirements of dependencies it asks for with extras (`pkg[extra]`).
"""

import argparse
import email.parser
import pathlib
import re
import sys

from pip._vendor.packaging.requirements import Requirement


def normalize(name):
  return re.sub(r"[-_.]+", "_", name).lower()


def lock_names(path):
  pattern = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==")
  with open(path) as f:
    return {normalize(m.group(1)) for m in map(pattern.match, f) if m}


def read_metadata(dist_info):
  """(name, requirements, {extra: requirements}); a requirement is
  (name, extras it asks for), markers evaluated for this interpreter."""
  with open(dist_info / "METADATA", encoding="utf-8") as f:
    headers = email.parser.Parser().parse(f, headersonly=True)
  provided = headers.get_all("Provides-Extra") or ()
  requires, extras = [], {}
  for line in headers.get_all("Requires-Dist") or ():
    requirement = Requirement(line)
    item = (normalize(requirement.name), tuple(sorted(requirement.extras)))
    if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
      requires.append(item)
      continue
    for extra in provided:
      if requirement.marker.evaluate({"extra": extra}):
        extras.setdefault(normalize(extra), []).append(item)
  return normalize(headers["Name"]), requires, extras


def expand_extras(requires, extras):
  """Names a distribution needs: its requirements plus, for each one that
  asks for extras (`typepy[datetime]`), that package's extra requirements."""
  names, todo, seen = set(), list(requires), set()
  while todo:
    name, wanted = todo.pop()
    names.add(name)
    for extra in wanted:
      if (name, extra) not in seen:
        seen.add((name, extra))
        todo.extend(extras.get(name, {}).get(normalize(extra), ()))
  return sorted(names)


def read_record(dist_info):
  paths = []
  with open(dist_info / "RECORD", encoding="utf-8") as f:
    for line in f:
      path = line.rsplit(",", 2)[0]
      if path and not path.startswith(("..", "/", "bin/")):
        paths.append(path)
  return paths


def owned_paths(records):
  """Maps each distribution to the fewest paths that it alone owns."""
  owners = {}  # path prefix -> set of distributions with files under it.
  for dist, paths in records.items():
    for path in paths:
      parts = path.split("/")
      for depth in range(1, len(parts) + 1):
        owners.setdefault("/".join(parts[:depth]), set()).add(dist)
  result = {}
  for dist, paths in records.items():
    chosen = set()
    for path in paths:
      parts = path.split("/")
      for depth in range(1, len(parts) + 1):
        prefix = "/".join(parts[:depth])
        if owners[prefix] == {dist}:
          chosen.add(prefix)
          break
      # A file shared by several distributions (rare) is left to none.
    result[dist] = sorted(chosen)
  return result


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--site", required=True)
  parser.add_argument("--lock", required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--base", default="")
  parser.add_argument("--base_lock", default="")
  args = parser.parse_args()

  site = pathlib.Path(args.site)
  locked = lock_names(args.lock)
  base = lock_names(args.base_lock) if args.base_lock else set()
  records, direct, extras = {}, {}, {}
  for dist_info in sorted(site.glob("*.dist-info")):
    name, direct[name], extras[name] = read_metadata(dist_info)
    records[name] = [p for p in read_record(dist_info) if (site / p).exists()]
  requires = {name: [dep for dep in expand_extras(items, extras) if dep != name]
              for name, items in direct.items()}
  missing = locked - set(records)
  if missing:
    sys.exit(f"generate_build: locked but not installed: {sorted(missing)}")

  out = ['package(default_visibility = ["//visibility:public"])', ""]
  for name, paths in sorted(owned_paths(records).items()):
    deps, unresolved = [], []
    for dep in requires[name]:
      if dep in records:
        deps.append(f":{dep}")
      elif dep in base:
        deps.append(f"{args.base}//:{dep}")
      else:
        unresolved.append(dep)
    out.append("py_library(")
    out.append(f'    name = "{name}",')
    out.append(f'    imports = ["{args.site}"],')
    out.append("    data = [")
    out.extend(f'        "{args.site}/{p}",' for p in paths)
    out.append("    ],")
    out.append("    deps = [")
    out.extend(f'        "{d}",' for d in deps)
    out.append("    ],")
    out.append(")")
    if unresolved:
      out.append(f"# {name}: not in the lock, so not a dep: {', '.join(unresolved)}")
    out.append("")
  for name in sorted(base - set(records)):
    out.append(f'alias(name = "{name}", actual = "{args.base}//:{name}")')
  with open(args.out, "w") as f:
    f.write("\n".join(out) + "\n")


if __name__ == "__main__":
  main()
