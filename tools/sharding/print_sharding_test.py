"""Golden sharding tables: the layout of every parameter stays as reviewed.

On mismatch, regenerate (and review the diff) with:

  tools/bazel run //tools/sharding:print_sharding -- --update_goldens
"""

import os

from absl.testing import absltest
from absl.testing import parameterized

from tools.sharding import goldens


def _read(name: str) -> str:
  manifest = os.environ.get("TEST_SRCDIR")
  candidates = [os.path.join(goldens.TESTDATA, name)]
  if manifest:
    candidates.insert(0, os.path.join(manifest, os.environ.get(
        "TEST_WORKSPACE", "__main__"), goldens.TESTDATA, name))
  for path in candidates:
    if os.path.isfile(path):
      with open(path) as f:
        return f.read()
  raise FileNotFoundError(f"Golden {name} not found in {candidates}.")


class PrintShardingTest(parameterized.TestCase):

  @parameterized.parameters(*goldens.GOLDENS)
  def test_matches_golden(self, name):
    self.assertMultiLineEqual(
        _read(name), goldens.golden_text(name),
        f"{name} changed; if intended, regenerate with `tools/bazel run"
        " //tools/sharding:print_sharding -- --update_goldens`.")

  def test_table_shows_sharded_kernels(self):
    text = goldens.golden_text("llama3_small_2x2x2.txt")
    self.assertRegex(text, r"blocks/mlp/gate/kernel\s+\(4, 256, 768\)\s+"
                     r"\('layers', 'embed', 'mlp'\)\s+"
                     r"P\(None, \('fsdp', 'sequence'\), "
                     r"'tensor'\)\s+393216")


if __name__ == "__main__":
  absltest.main()
