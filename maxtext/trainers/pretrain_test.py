"""End-to-end tests of maxtext.trainers.pretrain with a tiny Gemma 3."""

import glob
import json
import os
from unittest import mock

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs import gemma3
from maxtext.checkpoint import manager as checkpoint_lib
from maxtext.common import workdir as workdir_lib
from maxtext.data import pipeline
from maxtext.metrics import writers
from maxtext.trainers import config as config_lib
from maxtext.trainers import eval_step
from maxtext.trainers import hooks as hooks_lib
from maxtext.trainers import loop
from maxtext.trainers import pretrain
from maxtext.trainers import step_setup
from maxtext.trainers import train_state as train_state_lib
from testing import trees

_TEXT = """\
Now is the winter of our discontent
Made glorious summer by this sun of York;
And all the clouds that lour'd upon our house
In the deep bosom of the ocean buried.
"""


def _tiny_config(text_file: str, *, steps: int):
  """The real gemma3 config, shrunk to train in seconds on one CPU core."""
  config = gemma3.get_config()
  config.model.update(dict(num_layers=2, embed_dim=32, mlp_dim=64,
                           num_heads=2, num_kv_heads=1, head_dim=16,
                           query_pre_attn_scalar=16.0, sliding_window=8,
                           global_layer_interval=2))
  config.data.files = text_file
  config.data.seq_len = 16
  config.train.steps = steps
  config.train.batch_size = 4
  config.optimizer.learning_rate = 1e-2
  config.optimizer.warmup_steps = 2
  config.checkpoint.every_steps = 3
  config.logging.every_steps = 1
  return config


class PretrainTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.text_file = self.create_tempfile("richard3.txt",
                                          content=_TEXT * 4).full_path
    self.root = self.create_tempdir().full_path

  def test_training_reduces_loss_and_fills_the_workdir(self):
    workdir = os.path.join(self.root, "run")
    result = pretrain.train(_tiny_config(self.text_file, steps=25), workdir)
    self.assertEqual(result.step, 25)
    losses = writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    self.assertEqual(sorted(losses), list(range(1, 26)))
    first, last = losses[1]["train/loss"], losses[25]["train/loss"]
    self.assertLess(last, 0.5 * first)
    for key in ("train/perplexity", "train/learning_rate",
                "grads/global_norm", "perf/step_time_s",
                "perf/tokens_per_s_per_device",
                "perf/tflops_per_s_per_device", "perf/eta_s"):
      self.assertIn(key, losses[25])
    self.assertEqual(int(result.state.step), 25)
    with open(os.path.join(workdir, "config.json")) as f:
      self.assertEqual(json.load(f)["train"]["steps"], 25)
    self.assertNotEmpty(glob.glob(os.path.join(workdir, "tensorboard",
                                               "events.out.tfevents.*")))
    self.assertEqual(
        sorted(os.listdir(os.path.join(workdir, "checkpoints"))),
        ["21", "24", "25"])

  def test_resumed_run_equals_uninterrupted_run(self):
    steps = 7
    straight = pretrain.train(_tiny_config(self.text_file, steps=steps),
                              os.path.join(self.root, "straight"))
    resumed_dir = os.path.join(self.root, "resumed")
    first = pretrain.train(_tiny_config(self.text_file, steps=steps),
                           resumed_dir, hooks=[hooks_lib.StopAtStep(4)])
    self.assertEqual(first.step, 4)
    resumed = pretrain.train(_tiny_config(self.text_file, steps=steps),
                             resumed_dir)
    self.assertEqual(resumed.step, steps)

    jax.tree.map(np.testing.assert_array_equal, resumed.state.params,
                 straight.state.params)
    jax.tree.map(np.testing.assert_array_equal, resumed.state.opt_state,
                 straight.state.opt_state)
    straight_metrics = writers.read_jsonl(
        os.path.join(self.root, "straight", "metrics.jsonl"))
    resumed_metrics = writers.read_jsonl(
        os.path.join(resumed_dir, "metrics.jsonl"))
    for step in range(1, steps + 1):
      for key in ("train/loss", "grads/global_norm", "train/learning_rate"):
        self.assertEqual(resumed_metrics[step][key],
                         straight_metrics[step][key], (step, key))

  def test_guards_switch_on_and_off_when_resuming(self):
    steps = 6
    straight = pretrain.train(_tiny_config(self.text_file, steps=steps),
                              os.path.join(self.root, "straight"))
    workdir = os.path.join(self.root, "switched")
    pretrain.train(_tiny_config(self.text_file, steps=steps), workdir,
                   hooks=[hooks_lib.StopAtStep(2)])
    guarded = _tiny_config(self.text_file, steps=steps)
    # Lenient enough to skip nothing here: the result must equal the
    # unguarded run's.
    guarded.train.update(skip_nonfinite=True, spike_zscore=1e3,
                         spike_window=2)
    self.assertEqual(pretrain.train(guarded, workdir, hooks=[
        hooks_lib.StopAtStep(5)]).step, 5)
    resumed = pretrain.train(_tiny_config(self.text_file, steps=steps),
                             workdir)
    self.assertEqual(resumed.step, steps)
    metrics = writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    self.assertEqual([metrics[step].get("train/skipped_steps")
                      for step in range(1, steps + 1)],
                     [None, None, 0, 0, 0, None])
    # The guard's arithmetic changes XLA's fusions: rounding differs (1e-8
    # here, more where other kernels sum in another order), so within 1e-4
    # of each leaf's largest magnitude; a skipped or doubled update would
    # differ by the learning rate (1e-2).
    trees.assert_trees_close(resumed.state.params, straight.state.params,
                             rtol=1e-4, scaled_atol=1e-4)
    trees.assert_trees_close(resumed.state.opt_state,
                             straight.state.opt_state, rtol=1e-4,
                             scaled_atol=1e-4)

  def test_corrupt_latest_checkpoint_is_named(self):
    workdir = os.path.join(self.root, "corrupt")
    pretrain.train(_tiny_config(self.text_file, steps=2), workdir)
    state_dir = os.path.join(workdir, workdir_lib.CHECKPOINT_DIRNAME, "2",
                             checkpoint_lib.STATE_ITEM)
    for path in glob.glob(os.path.join(state_dir, "**", "*"), recursive=True):
      if os.path.isfile(path) and "commit_success" not in path:
        with open(path, "wb") as f:
          f.write(b"\0")
    with self.assertRaisesRegex(checkpoint_lib.CheckpointError,
                                os.path.join(workdir, "checkpoints", "2")):
      pretrain.train(_tiny_config(self.text_file, steps=4), workdir)

  def test_nan_loss_stops_naming_the_step(self):
    config = _tiny_config(self.text_file, steps=6)
    config.optimizer.learning_rate = 1e30
    config.optimizer.grad_clip_norm = 0.0
    config.optimizer.warmup_steps = 0
    with self.assertRaisesRegex(FloatingPointError, r"at step \d"):
      pretrain.train(config, os.path.join(self.root, "nan"))

  def test_an_update_that_makes_the_state_nonfinite_is_never_saved(self):
    # The loss and gradients stay finite; the update itself puts NaN in the
    # state (as an infinite learning rate did before the config refused it).
    poison_at = [2]  # The count of the poisoned update; -1: none.

    def poisoned_optimizer(opt_config, total_steps):
      def update(updates, count, params=None):
        del params
        # A literal, not a Python branch: both runs compile the same program.
        bad = count == poison_at[0]
        return jax.tree.map(lambda u: jnp.where(bad, jnp.nan, u),
                            updates), count + 1
      return optax.chain(make_optimizer(opt_config, total_steps),
                         optax.GradientTransformation(
                             lambda _: jnp.zeros([], jnp.int32), update))

    make_optimizer = step_setup.optimizer.make_optimizer

    def config(steps):
      config = _tiny_config(self.text_file, steps=steps)
      config.checkpoint.every_steps = 1
      return config

    workdir = os.path.join(self.root, "poisoned")
    with mock.patch.object(step_setup.optimizer, "make_optimizer",
                           poisoned_optimizer):
      with self.assertRaisesRegex(
          loop.NonFiniteError, "optimizer state became NaN or infinite at"
          " step 3 .*stopping before they are saved"):
        pretrain.train(config(4), workdir)
      checkpoints = os.path.join(workdir, workdir_lib.CHECKPOINT_DIRNAME)
      self.assertEqual(sorted(os.listdir(checkpoints)), ["1", "2"])
      # A rerun (the cause gone) resumes from step 2 as if never poisoned.
      poison_at[0] = -1
      resumed = pretrain.train(config(4), workdir)
      straight = pretrain.train(config(4), os.path.join(self.root, "clean"))
    self.assertEqual(resumed.step, 4)
    jax.tree.map(np.testing.assert_array_equal, resumed.state.params,
                 straight.state.params)

  def test_a_nonfinite_checkpoint_is_passed_over_like_a_corrupt_one(self):
    workdir = os.path.join(self.root, "nan_checkpoint")
    config = _tiny_config(self.text_file, steps=2)
    config.checkpoint.every_steps = 1
    first = pretrain.train(config, workdir)
    # Step 3's checkpoint, as a run without the state check could save it:
    # step 2's state with NaN parameters, its manifest intact.
    checkpoints = os.path.join(workdir, workdir_lib.CHECKPOINT_DIRNAME)
    checkpointer = checkpoint_lib.Checkpointer(
        checkpoints, max_to_keep=5, async_save=False, tier="persistent")
    tree, data_state = checkpointer.restore(first.state.checkpoint_tree(), 2)
    tree["params"] = jax.tree.map(lambda x: x * jnp.nan, tree["params"])
    tree["step"] = tree["step"] + 1
    checkpointer.save(3, tree, {**data_state, "next_step": 3})
    checkpointer.close()
    config.train.steps = 4
    with self.assertLogs(level="WARNING") as logs:
      resumed = pretrain.train(config, workdir)
    self.assertTrue(any("Checkpoint of step 3" in line and
                        "holds NaN or infinite values" in line
                        for line in logs.output), logs.output)
    self.assertEqual(resumed.step, 4)
    self.assertTrue(bool(train_state_lib.all_finite(resumed.state.params)))
    straight = pretrain.train(config, os.path.join(self.root, "straight4"))
    jax.tree.map(np.testing.assert_array_equal, resumed.state.params,
                 straight.state.params)
    self.assertEqual(len(glob.glob(os.path.join(
        checkpoints, f"3{checkpoint_lib.CORRUPT_MARK}*"))), 1)

  def test_eval_every_n_steps_equals_evaluating_the_state(self):
    eval_file = self.create_tempfile(
        "eval.txt", content=_TEXT.replace("York", "Lancaster")).full_path
    config = _tiny_config(self.text_file, steps=4)
    config.data.eval_files = eval_file
    config.data.eval_every_steps = 2
    config.data.eval_steps = 2
    workdir = os.path.join(self.root, "eval")
    result = pretrain.train(config, workdir)
    with open(os.path.join(workdir, writers.JSONL_FILENAME)) as f:
      evals = {line["step"]: line for line in map(json.loads, f)
               if "eval/loss" in line}
    self.assertEqual(sorted(evals), [2, 4])
    self.assertLess(evals[4]["eval/loss"], evals[2]["eval/loss"])
    # The hook's figures are those of an evaluation of the final state.
    experiment = config_lib.ExperimentConfig.from_config_dict(config)
    batches = pipeline.eval_batches(
        experiment.data, batch_size=experiment.train.batch_size,
        vocab_size=experiment.model.vocab_size)
    expected = eval_step.evaluate(result.state, [
        {k: jax.numpy.asarray(b[k]) for k in pipeline.MODEL_KEYS}
        for b in batches])
    self.assertAlmostEqual(evals[4]["eval/loss"], expected["eval/loss"],
                           places=5)
    self.assertEqual(evals[4]["eval/tokens"], expected["eval/tokens"])
    self.assertGreater(expected["eval/tokens"], 0)


if __name__ == "__main__":
  absltest.main()
