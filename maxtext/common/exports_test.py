"""Tests for maxtext.common.exports: whole or nothing, never over others'."""

import os

from absl.testing import absltest

from maxtext.common import exports


def _write(folder: str, files: dict[str, str]) -> None:
  for name, text in files.items():
    with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
      f.write(text)


def _read(folder: str) -> dict[str, str]:
  out = {}
  for name in os.listdir(folder):
    with open(os.path.join(folder, name), encoding="utf-8") as f:
      out[name] = f.read()
  return out


class WritingTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.root = self.create_tempdir().full_path
    self.target = os.path.join(self.root, "out")

  def _export(self, files):
    with exports.writing(self.target, kind="test") as folder:
      self.assertNotEqual(folder, self.target)
      self.assertFalse(os.path.exists(self.target) and
                       os.path.samefile(folder, self.target))
      _write(folder, files)

  def test_an_export_replaces_an_earlier_one_whole(self):
    self._export({"a": "1", "shard-2": "old"})
    self._export({"a": "2"})
    got = _read(self.target)
    self.assertEqual(got.pop(exports.MARKER).count('"kind": "test"'), 1)
    self.assertEqual(got, {"a": "2"})  # No file of the earlier export left.
    self.assertEqual(os.listdir(self.root), ["out"])  # Nothing left beside.

  def test_a_failed_export_leaves_the_earlier_one(self):
    self._export({"a": "1"})
    with self.assertRaisesRegex(RuntimeError, "disk full"):
      with exports.writing(self.target, kind="test") as folder:
        _write(folder, {"a": "half"})
        raise RuntimeError("disk full")
    self.assertEqual(_read(self.target)["a"], "1")
    self.assertEqual(os.listdir(self.root), ["out"])

  def test_an_empty_folder_is_a_valid_target(self):
    os.makedirs(self.target)
    self._export({"a": "1"})
    self.assertEqual(_read(self.target)["a"], "1")

  def test_a_folder_of_other_files_is_refused_naming_them(self):
    os.makedirs(self.target)
    _write(self.target, {"model.safetensors": "mine", "config.json": "{}"})
    with self.assertRaisesRegex(
        exports.ExportTargetError,
        f"^{self.target} holds files that are not an earlier export"
        r" \(config.json, model.safetensors\); choose a new or empty"):
      self._export({"a": "1"})
    self.assertEqual(_read(self.target)["model.safetensors"], "mine")
    # Unless the caller owns it (its own workdir's export folder).
    with exports.writing(self.target, kind="test", owned=True) as folder:
      _write(folder, {"a": "1"})
    self.assertNotIn("model.safetensors", _read(self.target))

  def test_a_file_is_refused(self):
    _write(self.root, {"out": "x"})
    with self.assertRaisesRegex(exports.ExportTargetError, "is a file"):
      self._export({"a": "1"})

  def test_an_export_never_overwrites_its_input(self):
    source = os.path.join(self.root, "ckpt")
    os.makedirs(os.path.join(source, "inner"))
    for target in (source, os.path.join(source, "inner"), self.root):
      with self.assertRaisesRegex(
          exports.ExportTargetError,
          f"The export to {target} would overwrite its own input {source}"):
        exports.check_target(target, sources=(source,), owned=True)
    exports.check_target(os.path.join(self.root, "other"), sources=(source,))

  def test_a_training_workdir_is_refused(self):
    workdir = os.path.join(self.root, "run")
    os.makedirs(os.path.join(workdir, "checkpoints"))
    _write(workdir, {"config.json": "{}"})
    for target in (workdir, os.path.join(workdir, "hf")):
      with self.assertRaisesRegex(
          exports.ExportTargetError,
          f"{target} is in the training workdir {workdir}"):
        exports.check_target(target)
    self.assertEqual(sorted(os.listdir(workdir)), ["checkpoints", "config.json"])


if __name__ == "__main__":
  absltest.main()
