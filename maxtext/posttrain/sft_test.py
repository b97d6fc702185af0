"""Tests SFT on a tiny model: it learns a fixed mapping, the loss counts
completions only, accumulation equals one large batch, and bad configs are
named."""

import os
import signal
from unittest import mock

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.checkpoint import params_checkpoint
from maxtext.data import pipeline
from maxtext.metrics import writers
from maxtext.posttrain import adapter
from maxtext.posttrain import posttrain_testing as pt
from maxtext.posttrain import binary
from maxtext.posttrain import runtime
from maxtext.posttrain import sft
from maxtext.posttrain.config import PosttrainConfig
from maxtext.trainers import preemption
from testing import trees


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


class SftTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.folder = self.create_tempdir().full_path
    self.ckpt = pt.write_checkpoint(self.folder)
    self.train = pt.write_jsonl(os.path.join(self.folder, "train.jsonl"),
                                pt.mapping_records(32))

  def _config(self, steps, **lora):
    config = pt.sft_test_config(self.folder, self.ckpt, steps=steps,
                                train_file=self.train, **lora)
    config.optimizer.learning_rate = 1e-2
    return config

  def test_learns_a_fixed_mapping(self):
    config = self._config(30)
    config.data.eval_files = pt.write_jsonl(
        os.path.join(self.folder, "eval.jsonl"), pt.mapping_records(8, 32))
    config.data.eval_every_steps = 30
    config.data.eval_steps = 1
    workdir = os.path.join(self.folder, "work")
    sft.run(config, workdir)
    metrics = writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    first, last = metrics[1]["train/loss"], metrics[30]["train/loss"]
    print(f"SFT fixed mapping: train/loss {first:.3f} -> {last:.4f}, eval"
          f" {metrics[30]['eval/loss']:.4f}")
    self.assertGreater(first, 3.0)
    self.assertLess(last, 0.02)
    # The eval records are new pairs of the same mapping.
    self.assertLess(metrics[30]["eval/loss"], 0.1)

  def test_loss_counts_completion_tokens_only(self):
    posttrain = PosttrainConfig.from_config_dict(self._config(1))
    data = sft.data_config(posttrain, self.folder)
    batches = pipeline.make_train_pipeline(data, batch_size=8,
                                           vocab_size=128)
    batch = next(iter(batches))
    batches.close()
    # Each row: user w_a w_b assistant w_c </s>; only w_c and </s> (the
    # assistant turn) are targets.
    eos = pt.NUM_WORDS + pt.SPECIAL_WORDS.index("</s>")
    assistant = pt.NUM_WORDS + pt.SPECIAL_WORDS.index("assistant")
    for inputs, targets, mask in zip(batch["inputs"], batch["targets"],
                                     batch["mask"]):
      turn = int(np.flatnonzero(inputs == assistant)[0])
      np.testing.assert_array_equal(np.flatnonzero(mask), [turn, turn + 1])
      self.assertEqual(targets[turn + 1], eos)
      self.assertBetween(targets[turn], 20, 49)
    cfg, params = params_checkpoint.load_params(self.ckpt)
    loaded = params_checkpoint.model_from_params(cfg, params)
    model = adapter.TunixModel(loaded)
    keys = {k: jnp.asarray(batch[k]) for k in pipeline.MODEL_KEYS}
    got = float(sft.sft_loss(model, **keys))
    logits = np.asarray(loaded(keys["inputs"], keys["positions"],
                               keys["segment_ids"]), np.float64)
    logp = np.take_along_axis(_log_softmax(logits),
                              batch["targets"][..., None], -1)[..., 0]
    want = -logp[batch["mask"] > 0].mean()
    np.testing.assert_allclose(got, want, rtol=1e-5)

  def test_accumulation_equals_one_batch(self):
    exported = []
    for microbatches in (1, 2):
      config = self._config(3)
      config.train.microbatches = microbatches
      result = sft.run(config, os.path.join(self.folder, f"m{microbatches}"))
      exported.append(params_checkpoint.load_params(
          result.exported["export"])[1])
    # Every row has two target tokens, so the mean of the halves' means is
    # the batch mean.
    # Adam turns rounding differences of the gradients into ~1e-6 ones:
    # within 1e-5, or 1e-4 of each leaf's largest magnitude (the gradients
    # are summed in another order); a wrong accumulation is off by the
    # learning rate (1e-2).
    trees.assert_trees_close(exported[1], exported[0], rtol=1e-4, atol=1e-5,
                             scaled_atol=1e-4)

  def test_resumed_run_equals_uninterrupted(self):
    def config(steps):
      c = self._config(steps, mode="lora", rank=4)
      c.optimizer.end_learning_rate_ratio = 1.0  # Constant: any run length.
      return c

    straight = sft.run(config(4), os.path.join(self.folder, "straight"))
    sft.run(config(2), os.path.join(self.folder, "resumed"))
    resumed = sft.run(config(4), os.path.join(self.folder, "resumed"))
    self.assertEqual(resumed.trainer.train_steps, 4)
    metrics = writers.read_jsonl(os.path.join(self.folder, "resumed",
                                              "metrics.jsonl"))
    self.assertEqual(sorted(metrics), [1, 2, 3, 4])
    got, want = (params_checkpoint.load_params(r.exported["export"])[1]
                 for r in (resumed, straight))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(a, b, atol=1e-6)

  def test_a_sigterm_saves_and_the_rerun_resumes_at_the_same_data(self):
    def config(steps):
      c = self._config(steps, mode="lora", rank=4)
      c.optimizer.end_learning_rate_ratio = 1.0  # Constant: any run length.
      c.train.microbatches = 2  # A stop falls between updates only.
      c.train.checkpoint_every_steps = 4  # Only the stop saves before 4.
      return c

    real_batches = sft.model_batches

    def sigterm_in_update_2(batches, *keys):
      for index, batch in enumerate(real_batches(batches, *keys)):
        if index == 3:  # Update 2's second microbatch.
          os.kill(os.getpid(), signal.SIGTERM)
        yield batch

    workdir = os.path.join(self.folder, "preempted")
    with mock.patch.object(sft, "model_batches", sigterm_in_update_2), \
        self.assertRaises(SystemExit) as stopped:
      binary.run_binary("sft", sft.run, config(4), config_path="sft.py",
                         load=None, workdir=workdir,
                         compilation_cache_dir=None)
    self.assertEqual(stopped.exception.code,
                     preemption.EXIT_CODE_PREEMPTED)
    saved = os.listdir(os.path.join(workdir,
                                    runtime.TUNIX_CHECKPOINT_DIRNAME))
    # Orbax saves the first update; update 2 (not a multiple of 4) was saved
    # by the stop.
    self.assertEqual(sorted(saved), ["1", "2"])
    self.assertFalse(os.path.exists(os.path.join(workdir, "export")))

    resumed = sft.run(config(4), workdir)
    straight = sft.run(config(4), os.path.join(self.folder, "straight"))
    self.assertEqual(resumed.trainer.train_steps, 4)
    got, want = (writers.read_jsonl(os.path.join(folder, "metrics.jsonl"))
                 for folder in (workdir, os.path.join(self.folder,
                                                      "straight")))
    self.assertEqual(sorted(got), [1, 2, 3, 4])
    for step in (1, 2, 3, 4):  # The same batches, in the same order.
      self.assertAlmostEqual(got[step]["train/loss"],
                             want[step]["train/loss"], places=5)
    got, want = (params_checkpoint.load_params(r.exported["export"])[1]
                 for r in (resumed, straight))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(a, b, atol=1e-6)

  def test_bad_configs_are_named(self):
    config = self._config(1)
    config.data.chat_template = ""
    with self.assertRaisesRegex(ValueError, "SFT needs data.chat_template"):
      sft.run(config, os.path.join(self.folder, "bad1"))
    config = self._config(1)
    config.sft.completion_field = ""
    with self.assertRaisesRegex(ValueError, "set both"):
      sft.run(config, os.path.join(self.folder, "bad2"))
    config = self._config(1)
    config.train.load = ""
    with self.assertRaisesRegex(ValueError, "train.load is empty"):
      sft.run(config, os.path.join(self.folder, "bad3"))
    config = self._config(1)
    config.lora.mode = "dora"
    with self.assertRaisesRegex(ValueError, "lora.mode='dora'.*'qlora'"):
      sft.run(config, os.path.join(self.folder, "bad4"))


if __name__ == "__main__":
  absltest.main()
