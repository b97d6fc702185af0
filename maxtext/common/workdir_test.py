"""Tests for maxtext.common.workdir."""

import json
import os
import signal
import socket
import subprocess
import sys
from unittest import mock

from absl.testing import absltest

from maxtext.common import workdir


class PathsTest(absltest.TestCase):

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


class ExclusiveTest(absltest.TestCase):

  def _hold_in_another_process(self, run_dir):
    """A process holding `workdir` until killed; returns it once it holds."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from maxtext.common import workdir\n"
         "with workdir.exclusive(sys.argv[1]):\n"
         "  print('held', flush=True); time.sleep(600)", run_dir],
        stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    self.addCleanup(holder.kill)
    self.assertEqual(holder.stdout.readline().strip(), "held")
    return holder

  def test_a_second_run_is_refused_until_the_first_dies(self):
    run_dir = os.path.join(self.create_tempdir().full_path, "run")
    holder = self._hold_in_another_process(run_dir)
    with self.assertRaisesRegex(
        workdir.WorkdirBusyError,
        rf"^Workdir {run_dir} is in use by another run \(pid {holder.pid} on"
        rf" {socket.gethostname()}, since .*\); wait for it to end, or choose"
        r" another --workdir.$"):
      with workdir.exclusive(run_dir):
        self.fail("entered a held workdir")
    holder.send_signal(signal.SIGKILL)  # The kernel releases its lock.
    holder.wait()
    with workdir.exclusive(run_dir):
      pass
    # Released on exit: the next run takes it again.
    with workdir.exclusive(run_dir):
      pass

  def test_a_process_that_does_not_take_it_is_not_refused(self):
    run_dir = self.create_tempdir().full_path
    self._hold_in_another_process(run_dir)
    with workdir.exclusive(run_dir, take=False):
      pass


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

  def test_each_checkpoint_has_the_config_of_the_run_that_saved_it(self):
    root = self.create_tempdir().full_path
    workdir.write_config(root, {"train": {"steps": 10}}, step=0)
    workdir.write_config(root, {"train": {"steps": 20}}, step=10)
    workdir.write_config(root, {"train": {"steps": 30}}, step=20)
    # Step 10 was saved before the resume at 10; step 11 after it.
    for step, name in ((1, "config.json"), (10, "config.json"),
                       (11, "config_step10.json"), (20, "config_step10.json"),
                       (25, "config_step20.json")):
      self.assertEqual(workdir.step_config_path(root, step),
                       os.path.join(root, name), step)


  def test_a_resume_compares_with_the_config_in_effect(self):
    root = self.create_tempdir().full_path
    first, second = {"train": {"steps": 10}}, {"train": {"steps": 20}}
    workdir.write_config(root, first, step=0)
    resumed = workdir.write_config(root, second, step=10)
    # The same config again writes nothing; the first run's again is a change.
    self.assertEqual(workdir.write_config(root, second, step=15), resumed)
    with self.assertLogs(level="WARNING"):
      reverted = workdir.write_config(root, first, step=20)
    self.assertEqual(reverted, os.path.join(root, "config_step20.json"))
    self.assertEqual(workdir.step_config_path(root, 25), reverted)
    with open(reverted) as f:
      self.assertEqual(json.load(f), first)

  def test_an_unreadable_config_in_effect_is_named(self):
    root = self.create_tempdir().full_path
    workdir.write_config(root, {"train": {"steps": 10}}, step=0)
    resumed = workdir.write_config(root, {"train": {"steps": 20}}, step=10)
    with open(resumed, "w") as f:
      f.write("{")
    with self.assertRaisesRegex(ValueError,
                                "run resumed at step 10 cannot be read.*"
                                "config_step10.json"):
      workdir.write_config(root, {"train": {"steps": 20}}, step=12)


if __name__ == "__main__":
  absltest.main()
