"""This workspace's @maxtext maps exactly the repositories that
`MAXTEXT_REPO_MAPPING` of @maxtext//:deps.bzl names (Starlark parses as
Python here)."""

import ast
import os

from absl.testing import absltest


def _read(path: str) -> ast.Module:
  with open(path, encoding="utf-8") as f:
    return ast.parse(f.read())


class RepoMappingTest(absltest.TestCase):

  def test_workspace_maps_what_deps_bzl_names(self):
    runfiles = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    [names] = [ast.literal_eval(node.generators[0].iter) for node in
               ast.walk(_read(os.path.join(runfiles, "maxtext", "deps.bzl")))
               if isinstance(node, ast.DictComp)]
    [mapping] = [
        ast.literal_eval(keyword.value)
        for node in ast.walk(_read(os.path.join(runfiles, "consumer",
                                                "WORKSPACE")))
        if isinstance(node, ast.Call)
        for keyword in node.keywords if keyword.arg == "repo_mapping"]
    self.assertEqual(mapping, {f"@{name}": f"@maxtext_{name}"
                               for name in names})


if __name__ == "__main__":
  absltest.main()
