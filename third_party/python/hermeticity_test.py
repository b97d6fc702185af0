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
    for entry in sys.path:
      self.assertNotIn("site-packages", entry)
      self.assertNotIn("dist-packages", entry)

  def test_declared_package_comes_from_the_lock(self):
    import absl  # pylint: disable=g-import-not-at-top

    path = os.path.realpath(absl.__file__)
    self.assertIn(os.path.join("external", "pypi", "site", "absl"), path)

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
