"""Tests the train binary's flags: config file, overrides, default workdir."""

import json
import os
import sys
from unittest import mock
import warnings

from absl import flags
from absl.testing import absltest

from maxtext.bin import train


class TrainBinaryTest(absltest.TestCase):

  def test_trains_into_the_default_workdir_with_overrides(self):
    user_dir = self.create_tempdir().full_path
    argv = [
        "train", "--config=configs/gemma3.py:small",
        "--config.train.steps=2", "--config.train.batch_size=2",
        "--config.data.seq_len=16", "--config.model.num_layers=1",
        "--config.logging.every_steps=1",
    ]
    # The config flag finds its overrides in sys.argv, as under app.run.
    with mock.patch.object(sys, "argv", argv), warnings.catch_warnings():
      # ml_collections loads config files with the deprecated load_module.
      warnings.filterwarnings("ignore", message=".*load_module",
                              category=DeprecationWarning)
      argv = flags.FLAGS(argv)
    with mock.patch.dict(os.environ, {"BUILD_WORKING_DIRECTORY": user_dir}):
      train.main(argv)
    workdir = os.path.join(user_dir, "runs", "gemma3_small")
    with open(os.path.join(workdir, "config.json")) as f:
      config = json.load(f)
    self.assertEqual(config["train"]["steps"], 2)
    self.assertEqual(config["model"]["num_layers"], 1)
    self.assertEqual(os.listdir(os.path.join(workdir, "checkpoints")), ["2"])
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      self.assertLen(f.readlines(), 2)

  def test_extra_arguments_are_rejected(self):
    with self.assertRaisesRegex(Exception, "Unexpected arguments"):
      train.main(["train", "stray"])


if __name__ == "__main__":
  absltest.main()
