"""The public targets are exactly those docs/api.md lists.

Reads every package's BUILD.bazel (Starlark, parsed as the Python syntax it
is a subset of): a target whose `visibility` holds "//visibility:public" is
part of the API, and docs/api.md names each with a line "- `//pkg:name`:".
"""

import ast
import os
import re

from absl.testing import absltest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_PUBLIC = "//visibility:public"


def _public_targets(package: str) -> set[str]:
  with open(os.path.join(_ROOT, package, "BUILD.bazel"),
            encoding="utf-8") as f:
    tree = ast.parse(f.read())
  public = set()
  for node in ast.walk(tree):
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
      continue
    keywords = {k.arg: k.value for k in node.keywords}
    if node.func.id == "package":
      if _PUBLIC in ast.literal_eval(keywords.get("default_visibility",
                                                  ast.List([]))):
        raise AssertionError(f"{package} makes every target public")
      continue
    if "name" in keywords and "visibility" in keywords and _PUBLIC in (
        ast.literal_eval(keywords["visibility"])):
      public.add(f"//{package}:{ast.literal_eval(keywords['name'])}")
  return public


def _packages() -> list[str]:
  """The packages whose BUILD files are in the runfiles (maxtext's and
  configs)."""
  found = ["configs"]
  for folder, _, files in os.walk(os.path.join(_ROOT, "maxtext")):
    if "BUILD.bazel" in files:
      found.append(os.path.relpath(folder, _ROOT))
  return found


class ApiTest(absltest.TestCase):

  def test_public_targets_are_the_documented_ones(self):
    packages = _packages()
    self.assertGreater(len(packages), 15)
    public = set().union(*map(_public_targets, packages))
    with open(os.path.join(_ROOT, "docs", "api.md"), encoding="utf-8") as f:
      documented = re.findall(r"(?m)^- `(//[\w/]+:\w+)`: \S", f.read())
    self.assertLen(documented, len(set(documented)), "listed twice")
    self.assertEqual(public, set(documented),
                     "public in a BUILD file but not in docs/api.md, or the"
                     " other way round")


if __name__ == "__main__":
  absltest.main()
