"""MODULE.bazel (Bazel 7+, not run here) declares what WORKSPACE does.

Bazel 7+ cannot be installed on the CI machines, so bzlmod is checked on
paper: MODULE.bazel, WORKSPACE and the module extension are parsed as the
Starlark they are (a subset of Python's syntax) and compared. Both must
reach the same repositories through the same function
(`maxtext_python_repositories`, whose pins are the lock files and hashes in
`repositories.bzl`), name the same host Python repository and register the
same toolchain; MODULE.bazel must bring every repository of that function
into scope (`use_repo`) and nothing else. WORKSPACE's `local_repository`
stand-ins for what @bazel_tools downloads under Bazel 4 are not bzlmod's
business (Bazel 7 resolves those itself).
"""

import ast
import os

from absl.testing import absltest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
# What WORKSPACE declares for Bazel 4.2.3 alone (see its comments).
_BAZEL4_STAND_INS = {"rules_cc", "rules_java", "remote_coverage_tools"}


def _calls(path: str) -> list[ast.Call]:
  """Every call in the Starlark file at `path` (relative to the root), in
  order."""
  with open(os.path.join(_ROOT, path), encoding="utf-8") as f:
    tree = ast.parse(f.read(), filename=path)
  return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def _name(call: ast.Call) -> str:
  return call.func.id if isinstance(call.func, ast.Name) else ""


def _keyword(call: ast.Call, key: str):
  """A keyword argument's value; `prefix + "name"` (a repository name under
  `maxtext_python_repositories(prefix)`) reads as "name"."""
  for keyword in call.keywords:
    if keyword.arg == key:
      value = keyword.value
      if (isinstance(value, ast.BinOp) and isinstance(value.left, ast.Name)
          and value.left.id == "prefix"):
        value = value.right
      return ast.literal_eval(value)
  return None


def _function_calls(path: str, function: str) -> list[ast.Call]:
  """The calls inside `def function(...)` of the file at `path`."""
  with open(os.path.join(_ROOT, path), encoding="utf-8") as f:
    tree = ast.parse(f.read(), filename=path)
  [body] = [node for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name == function]
  return [node for node in ast.walk(body) if isinstance(node, ast.Call)]


def _declared_repositories() -> set[str]:
  """The repositories `maxtext_python_repositories()` declares."""
  return {_keyword(call, "name") for call in _function_calls(
      "third_party/python/repositories.bzl",
      "maxtext_python_repositories")} - {None}


class BzlmodTest(absltest.TestCase):

  def test_module_declares_the_workspace_repositories(self):
    workspace = _calls("WORKSPACE")
    module = _calls("MODULE.bazel")
    extension = _function_calls("third_party/python/extensions.bzl",
                                "_python_deps_impl")
    repositories = _declared_repositories()
    self.assertIn("pypi", repositories)

    # The same functions declare the repositories in both.
    for calls in (workspace, extension):
      names = [_name(call) for call in calls]
      self.assertIn("maxtext_python_repositories", names)
      [host] = [call for call in calls if _name(call) == "host_python"]
      self.assertEqual(_keyword(host, "name"), "python_host")
    # WORKSPACE declares nothing else but Bazel 4's stand-ins.
    local = {_keyword(call, "name") for call in workspace
             if _name(call) == "local_repository"}
    self.assertEqual(local, _BAZEL4_STAND_INS)
    self.assertEqual(
        {_name(call) for call in workspace} - {"load", "workspace"},
        {"local_repository", "host_python", "register_toolchains",
         "maxtext_python_repositories"})

    # MODULE.bazel brings exactly those repositories into scope.
    [use_repo] = [call for call in module if _name(call) == "use_repo"]
    used = {ast.literal_eval(arg) for arg in use_repo.args[1:]}
    self.assertEqual(used, repositories | {"python_host"})
    [extension_use] = [call for call in module
                       if _name(call) == "use_extension"]
    self.assertEqual([ast.literal_eval(a) for a in extension_use.args],
                     ["//third_party/python:extensions.bzl", "python_deps"])
    self.assertEqual(
        [call for call in module if _name(call) == "bazel_dep"], [],
        "MODULE.bazel depends on no registry module (none can be fetched"
        " here)")

    # The same toolchain.
    def toolchains(calls):
      return [ast.literal_eval(arg) for call in calls
              if _name(call) == "register_toolchains" for arg in call.args]

    self.assertEqual(toolchains(module), toolchains(workspace))
    self.assertEqual(toolchains(module), ["@python_host//:py_toolchain"])

  def test_consumer_mapping_covers_our_repositories(self):
    # deps.bzl's MAXTEXT_REPO_MAPPING names every repository we declare (the
    # example consumer's test holds its @maxtext's mapping equal to it).
    repositories = _declared_repositories()
    with open(os.path.join(_ROOT, "deps.bzl"), encoding="utf-8") as f:
      [comprehension] = [node for node in ast.walk(ast.parse(f.read()))
                         if isinstance(node, ast.DictComp)]
    names = set(ast.literal_eval(comprehension.generators[0].iter))
    self.assertEqual(names, repositories | {"python_host"})

  def test_module_name_is_the_workspace_name(self):
    [workspace] = [call for call in _calls("WORKSPACE")
                   if _name(call) == "workspace"]
    [module] = [call for call in _calls("MODULE.bazel")
                if _name(call) == "module"]
    self.assertEqual(_keyword(module, "name"), _keyword(workspace, "name"))


if __name__ == "__main__":
  absltest.main()
