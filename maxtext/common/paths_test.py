"""Tests for maxtext.common.paths."""

import dataclasses
import os
from unittest import mock

from absl.testing import absltest

from maxtext.common import paths


@dataclasses.dataclass(frozen=True)
class _Section:
  one: str = paths.field()
  many: str = paths.field(paths.user_patterns)
  name: str = "left/as/typed"


class PathsTest(absltest.TestCase):

  def test_user_path_prefers_the_bazel_working_directory(self):
    with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": "/home/me"}):
      self.assertEqual(paths.user_path("runs/x"), "/home/me/runs/x")
      self.assertEqual(paths.user_path("/abs/x"), "/abs/x")
    with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": ""}):
      self.assertEqual(paths.user_path("x"), os.path.join(os.getcwd(), "x"))

  def test_config_file_resolution(self):
    user_dir = self.create_tempdir()
    user_dir.create_file("my.py", content="")
    runfiles = self.create_tempdir()
    runfiles.create_file("configs/gemma3.py", content="")
    with mock.patch.dict(os.environ,
                         {"BUILD_WORKING_DIRECTORY": user_dir.full_path}):
      cwd = os.getcwd()
      os.chdir(runfiles.full_path)
      try:
        # A bundled config is read from the runfiles (the current directory).
        self.assertEqual(paths.config_file_path("configs/gemma3.py:1b"),
                         "configs/gemma3.py:1b")
        # The user's own file is found where they ran the command.
        mine = os.path.join(user_dir.full_path, "my.py")
        self.assertEqual(paths.config_file_path("my.py:a"), mine + ":a")
        self.assertEqual(
            paths.resolve_config_argv(
                ["train", "--config=my.py", "--config.train.steps=3"]),
            ["train", f"--config={mine}", "--config.train.steps=3"])
        self.assertEqual(
            paths.resolve_config_argv(["train", "--config", "my.py"]),
            ["train", "--config", mine])
      finally:
        os.chdir(cwd)

  def test_bare_names_are_bundled_configs(self):
    # `gemma3` (`gemma3:small`) is configs/gemma3.py: the runfiles' here, the
    # installed `maxtext.configs` of the pip install.
    path, _, arg = paths.config_file_path("gemma3:small").partition(":")
    self.assertEqual((os.path.basename(path), arg), ("gemma3.py", "small"))
    self.assertEqual(os.path.basename(os.path.dirname(path)), "configs")
    with open(path, encoding="utf-8") as f:
      self.assertIn("def get_config(", f.read())
    # A name no config has is the user's path, as before.
    with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": "/home/me"}):
      self.assertEqual(paths.config_file_path("gemma33:x"),
                       "/home/me/gemma33:x")


class OutputPathTest(absltest.TestCase):

  def test_patterns_resolve_each_entry_and_drop_blanks(self):
    with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": "/home/me"}):
      self.assertEqual(paths.user_patterns("a/*.jsonl, /abs/b.jsonl,,"),
                       "/home/me/a/*.jsonl,/abs/b.jsonl")
      self.assertEqual(paths.user_patterns(""), "")
      self.assertEqual(paths.user_path(""), "")
      self.assertEqual(paths.user_path("~/x"), os.path.expanduser("~/x"))

  def test_marked_fields_resolve_and_the_input_is_left_alone(self):
    values = {"one": "data/t.json", "many": "x/*.jsonl,y.jsonl",
              "name": "left/as/typed"}
    with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": "/home/me"}):
      resolved = paths.resolve_values(_Section, values)
      self.assertEqual(
          resolved, {"one": "/home/me/data/t.json",
                     "many": "/home/me/x/*.jsonl,/home/me/y.jsonl",
                     "name": "left/as/typed"})
      self.assertEqual(values["one"], "data/t.json")
      # Unset (empty) and absent values stay as they are.
      self.assertEqual(paths.resolve_values(_Section, {"one": ""}),
                       {"one": ""})


if __name__ == "__main__":
  absltest.main()
