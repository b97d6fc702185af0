"""Tests for maxtext.trainers.workdir."""

import json
import os
from unittest import mock

from absl.testing import absltest

from maxtext.trainers import workdir


class PathsTest(absltest.TestCase):

  def test_user_path_prefers_the_bazel_working_directory(self):
    with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": "/home/me"}):
      self.assertEqual(workdir.user_path("runs/x"), "/home/me/runs/x")
      self.assertEqual(workdir.user_path("/abs/x"), "/abs/x")
    with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": ""}):
      self.assertEqual(workdir.user_path("x"), os.path.join(os.getcwd(), "x"))

  def test_default_workdir(self):
    with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": "/home/me"}):
      self.assertEqual(workdir.default_workdir("configs/gemma3.py"),
                       "/home/me/runs/gemma3")
      self.assertEqual(workdir.default_workdir("configs/gemma3.py:1b"),
                       "/home/me/runs/gemma3_1b")
      self.assertEqual(workdir.default_workdir("/x/llama3.py:3.1-8b"),
                       "/home/me/runs/llama3_3.1-8b")
      self.assertEqual(workdir.resolve_workdir(None, "configs/gemma3.py"),
                       "/home/me/runs/gemma3")
      self.assertEqual(workdir.resolve_workdir("out", "configs/gemma3.py"),
                       "/home/me/out")

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
        self.assertEqual(workdir.config_file_path("configs/gemma3.py:1b"),
                         "configs/gemma3.py:1b")
        # The user's own file is found where they ran the command.
        mine = os.path.join(user_dir.full_path, "my.py")
        self.assertEqual(workdir.config_file_path("my.py:a"), mine + ":a")
        self.assertEqual(
            workdir.resolve_config_argv(
                ["train", "--config=my.py", "--config.train.steps=3"]),
            ["train", f"--config={mine}", "--config.train.steps=3"])
        self.assertEqual(
            workdir.resolve_config_argv(["train", "--config", "my.py"]),
            ["train", "--config", mine])
      finally:
        os.chdir(cwd)


class OutputPathTest(absltest.TestCase):

  def test_relative_paths_stay_inside_the_workdir(self):
    root = self.create_tempdir().full_path
    self.assertEqual(workdir.output_path(root, "local", key="k"),
                     os.path.join(root, "local"))
    self.assertEqual(workdir.output_path(root, "a/../b/./c", key="k"),
                     os.path.join(root, "b", "c"))

  def test_escaping_paths_are_refused_naming_key_value_and_workdir(self):
    root = self.create_tempdir().full_path
    for path in ("/etc/cron.d", "../sibling", "a/../../x", "~/x", ".", ""):
      with self.assertRaisesRegex(
          ValueError, rf"^checkpoint.local_dir={path!r} must name a folder"
          rf" inside the workdir {root} "):
        workdir.output_path(root, path, key="checkpoint.local_dir")

  def test_a_symlink_made_in_the_workdir_may_lead_elsewhere(self):
    root = self.create_tempdir().full_path
    ram_disk = self.create_tempdir().full_path
    os.symlink(ram_disk, os.path.join(root, "fast"))
    path = workdir.output_path(root, "fast/ckpt", key="k")
    self.assertEqual(path, os.path.join(root, "fast", "ckpt"))
    os.makedirs(path)
    self.assertTrue(os.path.isdir(os.path.join(ram_disk, "ckpt")))


class WriteConfigTest(absltest.TestCase):

  def test_written_once_and_changes_recorded(self):
    root = self.create_tempdir().full_path
    config = {"train": {"steps": 10}, "data": {"seq_len": 8}}
    path = workdir.write_config(root, config, step=0)
    self.assertEqual(path, os.path.join(root, "config.json"))
    self.assertEqual(workdir.write_config(root, config, step=5), path)
    self.assertEqual(os.listdir(root), ["config.json"])
    changed = {"train": {"steps": 20}, "data": {"seq_len": 8}}
    with self.assertLogs(level="WARNING") as logs:
      path = workdir.write_config(root, changed, step=10)
    self.assertEqual(path, os.path.join(root, "config_step10.json"))
    self.assertIn("train.steps", "\n".join(logs.output))
    with open(os.path.join(root, "config.json")) as f:
      self.assertEqual(json.load(f), config)
    with open(path) as f:
      self.assertEqual(json.load(f), changed)


if __name__ == "__main__":
  absltest.main()
