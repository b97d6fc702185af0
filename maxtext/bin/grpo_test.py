"""Tests the grpo binary end to end on the toy task (a few updates): metrics,
a Tunix checkpoint and the exported policy; and the one-line error of a bad
config value."""

import os
import tempfile

from absl import flags
from absl.testing import absltest

from maxtext.bin import grpo
from maxtext.checkpoint import params_checkpoint
from maxtext.metrics import writers
from maxtext.posttrain import posttrain_testing as pt

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


class GrpoBinaryTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.user_dir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    cls.argv = pt.parse_binary_flags([
        "grpo", f"--config={_ROOT}/configs/grpo.py:gspo", "--workdir=run",
        "--config.train.steps=4", "--config.train.batch_size=4",
        "--config.rl.num_generations=4", "--config.logging.tensorboard=false"])

  def _main(self) -> None:
    pt.run_binary_main(grpo.main, self.argv, self.user_dir)

  def test_trains_and_exports_the_policy(self):
    self._main()
    run = os.path.join(self.user_dir, "run")
    metrics = writers.read_jsonl(os.path.join(run, "metrics.jsonl"))
    self.assertContainsSubset([1, 2, 3, 4], metrics)
    self.assertIn("train/actor/loss", metrics[4])
    self.assertIn("train/rewards/exact_answer", metrics[1])
    self.assertTrue(os.listdir(os.path.join(run, "tunix_checkpoints",
                                            "actor")))
    cfg, params = params_checkpoint.load_params(os.path.join(run, "export"))
    initial_cfg, initial = params_checkpoint.load_params(
        os.path.join(run, "initial_model"))
    self.assertEqual(cfg, initial_cfg)
    self.assertFalse((params["embedder"]["embedding"] ==
                      initial["embedder"]["embedding"]).all())
    self.assertTrue(os.path.isfile(os.path.join(run, "export",
                                                "tokenizer.json")))

  def test_a_bad_value_is_a_one_line_error(self):
    config = flags.FLAGS.config
    config.rl.loss_algo = "ppo"
    try:
      with self.assertRaises(SystemExit) as caught:
        self._main()
    finally:
      config.rl.loss_algo = "gspo-token"
    self.assertEqual(
        caught.exception.code,
        "grpo: error: ValueError: rl.loss_algo='ppo' is invalid; valid:"
        " ('grpo', 'gspo-token').")


if __name__ == "__main__":
  absltest.main()
