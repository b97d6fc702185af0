"""The Python toolchain hides everything a target does not declare."""

import importlib
import os
import sys

from absl.testing import absltest
from absl.testing import parameterized


class HermeticityTest(parameterized.TestCase):

  def test_interpreter_skips_site_packages(self):
    self.assertEqual(sys.flags.no_site, 1)
    self.assertEqual(sys.flags.safe_path, True)
    # Our packages sit in <repo>/site-packages (so that libraries that tell
    # installed modules by that name, like dill, treat them as installed);
    # no other site-packages may be on the path.
    for entry in sys.path:
      if "site-packages" in entry:
        self.assertRegex(entry, r"/pypi(_test)?/site-packages$")
      self.assertNotIn("dist-packages", entry)

  def test_declared_package_comes_from_the_lock(self):
    import absl  # pylint: disable=g-import-not-at-top

    path = os.path.realpath(absl.__file__)
    self.assertIn(os.path.join("external", "pypi", "site-packages", "absl"), path)

  @parameterized.parameters(
      "numpy",  # In @pypi, but this test does not declare it.
      "jax",  # Likewise.
      "torch",  # Only in @pypi_test, not declared.
      "boto3",  # Only on the host, in no lock.
  )
  def test_undeclared_package_fails_to_import(self, module):
    with self.assertRaises(ImportError):
      importlib.import_module(module)


if __name__ == "__main__":
  absltest.main()
