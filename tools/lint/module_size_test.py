"""Every library module under maxtext/ stays at most 450 lines, and no
layer reads the whole model config.

One concept per module: a module past the limit is split by concern (see
`../shared/STYLE.md`), not allowed to grow. A layer receives its own part
of the model config (`maxtext.common.model_config.PARTS`), so no module in
`maxtext/layers/` imports `ModelConfig`. Tensors' shape suffixes use the
letters of the one shape key, `maxtext.common.axes.SHAPE_KEY`, and no
module keeps a key of its own. The modules are this test's
data (each maxtext package's `py_srcs` filegroup, tests excluded), so the
test reruns whenever one changes.
"""

import io
import os
import re
import tokenize

from absl.testing import absltest

from maxtext.common import axes

MAX_LINES = 450
_HERE = os.path.dirname(os.path.abspath(__file__))
_RUNFILES_ROOT = os.path.dirname(os.path.dirname(_HERE))


def _modules(root: str) -> dict[str, str]:
  """Package-relative path -> path of each library module under root/maxtext."""
  out = {}
  for folder, _, files in os.walk(os.path.join(root, "maxtext")):
    for name in files:
      if name.endswith(".py") and not name.endswith("_test.py"):
        path = os.path.join(folder, name)
        out[os.path.relpath(path, root)] = path
  return out


class ModuleSizeTest(absltest.TestCase):

  def test_every_library_module_is_at_most_450_lines(self):
    modules = _modules(_RUNFILES_ROOT)
    self.assertGreater(len(modules), 100)  # The filegroups are in the data.
    too_long = {}
    for name, path in sorted(modules.items()):
      with open(path, encoding="utf-8") as f:
        count = sum(1 for _ in f)
      if count > MAX_LINES:
        too_long[name] = count
    self.assertEqual(too_long, {}, f"library modules over {MAX_LINES} lines"
                     " (split them by concern)")

  def test_no_layer_imports_the_model_config(self):
    importers = []
    for name, path in sorted(_modules(_RUNFILES_ROOT).items()):
      if name.startswith(os.path.join("maxtext", "layers") + os.sep):
        with open(path, encoding="utf-8") as f:
          if "maxtext.common.model_config" in f.read():
            importers.append(name)
    self.assertEqual(importers, [], "layers take their own config part")

  def test_shape_suffixes_use_the_one_shape_key(self):
    # A suffix: after the last underscore, letters (and 1) with at least
    # one capital (`q_BLHK`, `cos_BLk`); names in code, not in strings.
    suffix = re.compile(r"^[a-z][a-z0-9_]*_([A-Za-z1]*[A-Z][A-Za-z1]*)$")
    unknown, own_keys = {}, []
    for name, path in sorted(_modules(_RUNFILES_ROOT).items()):
      with open(path, encoding="utf-8") as f:
        source = f.read()
      if re.search(r"^Shape key:", source, re.M):
        own_keys.append(name)
      for token in tokenize.generate_tokens(io.StringIO(source).readline):
        match = token.type == tokenize.NAME and suffix.match(token.string)
        if match and set(match.group(1)) - set(axes.SHAPE_KEY):
          unknown.setdefault(name, set()).add(token.string)
    self.assertEqual(unknown, {}, "letters not in axes.SHAPE_KEY")
    self.assertEqual(own_keys, [], "name axes.SHAPE_KEY, not a key of its own")

  def test_every_package_is_in_the_data(self):
    # The source tree, where the runfiles link to: a package without a
    # py_srcs filegroup in this test's data would go unchecked.
    source_root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.realpath(__file__))))
    if source_root == _RUNFILES_ROOT:
      self.skipTest("the runfiles are copies: no source tree to compare")
    packages = {os.path.dirname(name) for name in _modules(source_root)}
    covered = {os.path.dirname(name) for name in _modules(_RUNFILES_ROOT)}
    self.assertEqual(packages - covered, set(),
                     "add these packages' py_srcs to //tools/lint's data")


if __name__ == "__main__":
  absltest.main()
