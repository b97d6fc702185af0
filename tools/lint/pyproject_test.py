"""pyproject.toml (the pip path) agrees with the repository: its
dependencies are requirements.in's, its console scripts maxtext/bin's, its
packages every folder of library modules."""

import os
import tomllib

from absl.testing import absltest

from maxtext.bin import console

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _pyproject() -> dict:
  with open(os.path.join(_ROOT, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)


class PyprojectTest(absltest.TestCase):

  def test_dependencies_are_requirements_in(self):
    path = os.path.join(_ROOT, "third_party", "python", "requirements.in")
    with open(path, encoding="utf-8") as f:
      wanted = [line.split("#")[0].strip() for line in f]
    self.assertEqual(_pyproject()["project"]["dependencies"],
                     [line for line in wanted if line])

  def test_scripts_start_the_binaries(self):
    scripts = _pyproject()["project"]["scripts"]
    self.assertEqual(scripts, {script: f"maxtext.bin.console:{binary}"
                               for script, binary in console.SCRIPTS.items()})
    for binary in console.SCRIPTS.values():
      self.assertTrue(callable(getattr(console, binary)), binary)
      self.assertTrue(os.path.exists(
          os.path.join(_ROOT, "maxtext", "bin", f"{binary}.py")), binary)

  def test_packages_are_every_folder_of_modules(self):
    setuptools = _pyproject()["tool"]["setuptools"]
    folders = {f"maxtext.{name}" for name in os.listdir(
        os.path.join(_ROOT, "maxtext"))
               if any(file.endswith(".py") for file in os.listdir(
                   os.path.join(_ROOT, "maxtext", name)))}
    bundled = {f"maxtext.{name}" for name in console.BUNDLED}
    self.assertEqual(set(setuptools["packages"]), folders | bundled)
    self.assertEqual(setuptools["package-dir"],
                     {f"maxtext.{name}": name for name in console.BUNDLED})


if __name__ == "__main__":
  absltest.main()
