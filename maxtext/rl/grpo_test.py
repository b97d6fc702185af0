"""Tests of the GRPO/GSPO run: the toy task's reward rises, the two losses
equal a numpy computation of their formulas on one batch (and differ only
when the rollouts came from an older policy), a separate rollout mesh trains
like a shared one (2 CPU devices:
JAX_NUM_CPU_DEVICES=2), and config errors name
the key."""

import os
import signal
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax.numpy as jnp
import numpy as np
from tunix.rl import algo_core
from tunix.rl import function_registry
from tunix.rl.grpo import grpo_learner

from configs import grpo as grpo_config
from maxtext.metrics import writers
from maxtext.models import registry
from maxtext.posttrain import posttrain_testing
from maxtext.posttrain import runtime
from maxtext.rl import grpo
from maxtext.rl import policy
from maxtext.rl import rollout_base
from maxtext.rl.config import RlRunConfig
from testing import devices
from testing import tiny_configs

_PAD, _EOS, _EPSILON = 0, 1, 0.2


def _np_log_softmax(logits):
  logits = logits - logits.max(-1, keepdims=True)
  return logits - np.log(np.exp(logits).sum(-1, keepdims=True))


def _np_loss(logps_BT, old_BT, mask_BT, advantages_B, loss_algo,
             eps_high=_EPSILON, aggregation="sequence-mean-token-mean"):
  """The clipped policy loss of GRPO or GSPO-token (Shao et al. 2024, Zheng
  et al. 2025), with DAPO's clip-higher bound 1 + eps_high and token-level
  aggregation (Yu et al. 2025, eq. 8) or Dr. GRPO's sum over a constant
  length (Liu et al. 2025, eq. 3), from the papers' formulas."""
  log_ratio_BT = logps_BT - old_BT
  if loss_algo == "gspo-token":
    # The sequence's ratio: exp of the mean log-ratio of its tokens.
    seq_B = (log_ratio_BT * mask_BT).sum(-1) / mask_BT.sum(-1)
    log_ratio_BT = np.broadcast_to(seq_B[:, None], logps_BT.shape)
  ratio_BT = np.exp(log_ratio_BT)
  adv_B1 = advantages_B[:, None]
  loss_BT = np.maximum(-adv_B1 * ratio_BT, -adv_B1 * np.clip(
      ratio_BT, 1 - _EPSILON, 1 + eps_high)) * mask_BT
  if aggregation == "token-mean":  # DAPO: every token of the batch alike.
    return loss_BT.sum() / mask_BT.sum()
  if aggregation == "sequence-mean-token-scale":  # Dr. GRPO.
    return (loss_BT.sum(-1) / mask_BT.shape[1]).mean()
  return (loss_BT.sum(-1) / mask_BT.sum(-1)).mean()


class LossTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cfg = tiny_configs.tiny_model_config("llama3", window=0)
    cls.model = policy.PolicyModel(
        registry.create_model(cfg, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(0)
    prompts_BP = rng.integers(2, 64, (4, 5)).astype(np.int32)
    prompts_BP[0, :2] = _PAD  # Left padding.
    completions_BT = rng.integers(2, 64, (4, 6)).astype(np.int32)
    completions_BT[1, 3:] = _PAD  # Stopped early.
    completions_BT[2, 5:] = _PAD
    cls.prompts_BP, cls.completions_BT = prompts_BP, completions_BT
    cls.mask_BT = (completions_BT != _PAD).astype(np.float32)
    cls.advantages_B = np.array([1.0, -0.5, 0.8, -1.2], np.float32)
    # The model's log-probs of the completions, by a plain forward.
    tokens_BL = np.concatenate([prompts_BP, completions_BT], 1)
    valid_BL = tokens_BL != _PAD
    positions_BL = np.maximum(np.cumsum(valid_BL, 1) - 1, 0)
    logits_BLV, _ = cls.model(jnp.asarray(tokens_BL),
                              jnp.asarray(positions_BL),
                              segment_ids=jnp.asarray(valid_BL, jnp.int32))
    logprobs_BLV = _np_log_softmax(np.asarray(logits_BLV, np.float64))
    length = completions_BT.shape[1]
    cls.logps_BT = np.take_along_axis(
        logprobs_BLV[:, -length - 1:-1], completions_BT[..., None], -1)[..., 0]
    # An older policy's log-probs (as after an earlier iteration).
    cls.old_BT = cls.logps_BT + rng.normal(0, 0.3, cls.logps_BT.shape)

  def _example(self, old_BT) -> grpo_learner.TrainExample:
    """The batch, its rollouts from the policy of `old_BT` (None: this
    one)."""
    return grpo_learner.TrainExample(
        prompt_ids=jnp.asarray(self.prompts_BP),
        prompt_mask=jnp.asarray(self.prompts_BP != _PAD),
        completion_ids=jnp.asarray(self.completions_BT),
        completion_mask=jnp.asarray(self.mask_BT),
        advantages=jnp.asarray(self.advantages_B),
        ref_per_token_logps=None,
        old_per_token_logps=(None if old_BT is None else
                             jnp.asarray(old_BT, jnp.float32)))

  def _loss(self, loss_algo, old_BT):
    config = grpo_learner.GRPOConfig(loss_algo=loss_algo, num_generations=2,
                                     num_iterations=2, beta=0.0,
                                     epsilon=_EPSILON)
    config.temperature = 1.0
    loss, _ = algo_core.grpo_loss_fn(self.model, self._example(old_BT),
                                     config, pad_id=_PAD, eos_id=_EOS)
    return float(loss)

  @parameterized.parameters("grpo", "gspo-token")
  def test_loss_equals_the_formula(self, loss_algo):
    want = _np_loss(self.logps_BT, self.old_BT, self.mask_BT,
                    self.advantages_B, loss_algo)
    self.assertAlmostEqual(self._loss(loss_algo, self.old_BT), want,
                           places=5)

  @parameterized.parameters(("dapo", 0.28, "token-mean"),
                            ("dr_grpo", _EPSILON,
                             "sequence-mean-token-scale"))
  def test_variant_loss_equals_the_formula(self, variant, eps_high,
                                           aggregation):
    """The loss the actor trains on (`grpo.actor_loss` of the variant's
    config) on an off-policy batch, where clip-higher matters."""
    config = grpo_config.get_config(variant)
    config.rl.update(num_iterations=2, num_generations=2)
    algo = grpo.grpo_config(RlRunConfig.from_config_dict(config))
    algo.temperature = 1.0
    self.assertEqual(algo.epsilon_high, eps_high)
    loss, aux = grpo.actor_loss(algo, _PAD, _EOS)(self.model,
                                                  self._example(self.old_BT))
    want = _np_loss(self.logps_BT, self.old_BT, self.mask_BT,
                    self.advantages_B, "grpo", eps_high, aggregation)
    self.assertAlmostEqual(float(loss), want, places=5)
    self.assertGreater(float(aux["pg_clipfrac"]), 0.0)
    if variant == "dapo":  # The upper bound moved: not GRPO's loss.
      self.assertGreater(abs(want - _np_loss(
          self.logps_BT, self.old_BT, self.mask_BT, self.advantages_B,
          "grpo", _EPSILON, aggregation)), 1e-4)

  @parameterized.parameters("grpo", "drgrpo", "rloo")
  def test_advantages_equal_the_formulas(self, estimator):
    rewards_B = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.5, 0.0, 2.0],
                         np.float32)
    groups = rewards_B.reshape(3, 3)
    mean = groups.mean(1, keepdims=True)
    want = {"grpo": (groups - mean) / (groups.std(1, ddof=1,
                                                  keepdims=True) + 1e-6),
            "drgrpo": groups - mean,  # Liu et al. 2025: no std.
            "rloo": groups - (groups.sum(1, keepdims=True) - groups) / 2}
    config = grpo_config.get_config()
    config.rl.update(advantage_estimator=estimator, num_generations=3)
    algo = grpo.grpo_config(RlRunConfig.from_config_dict(config))
    got = function_registry.get_advantage_estimator(
        algo.advantage_estimator)(rewards=rewards_B, num_generations=3)
    np.testing.assert_allclose(np.asarray(got), want[estimator].ravel(),
                               rtol=1e-6, atol=1e-6)

  def test_gspo_differs_from_grpo_only_off_policy(self):
    # One iteration: the old policy is the current one; both ratios are 1.
    self.assertAlmostEqual(self._loss("grpo", None),
                           self._loss("gspo-token", None), places=6)
    self.assertAlmostEqual(
        self._loss("grpo", None),
        -float(self.advantages_B.mean()), places=6)
    grpo_loss = self._loss("grpo", self.old_BT)
    gspo_loss = self._loss("gspo-token", self.old_BT)
    self.assertGreater(abs(grpo_loss - gspo_loss), 1e-3)


class RunTest(absltest.TestCase):

  def test_toy_reward_rises(self):
    config = grpo_config.get_config()
    config.train.steps = 20
    config.logging.tensorboard = False
    config.export.merged = False
    workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    grpo.run(config, workdir)
    metrics = writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    reward = [metrics[step]["train/rewards/sum"] for step in range(20)]
    first, last = np.mean(reward[:4]), np.mean(reward[-4:])
    self.assertGreater(last, first + 0.2, reward)
    self.assertIn("train/actor/kl", metrics[5])
    # The rollout's speed and time are those of its generated tokens; a
    # batch's cycle holds its rollout.
    step = metrics[5]
    completions = config.train.batch_size * config.rl.num_generations
    self.assertAlmostEqual(
        step["train/rollout/tokens_per_s"] * step["train/rollout/seconds"],
        step["train/completions/mean_length"] * completions, places=3)
    self.assertNotIn("train/perf/batch_seconds", metrics[0])
    self.assertGreater(step["train/perf/batch_seconds"],
                       step["train/rollout/seconds"])

  def test_dapo_toy_penalises_the_rollouts_own_lengths(self):
    config = grpo_config.get_config("dapo")
    config.rl.dynamic_sampling_rounds = 0  # One rollout per update.
    config.train.steps = 4
    config.logging.tensorboard = False
    config.export.merged = False
    workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    lengths = []
    output = rollout_base.PolicyRollout._output  # pylint: disable=protected-access

    def recorded(engine, tokens, *args):
      lengths.append([len(t) for t in tokens])
      return output(engine, tokens, *args)

    with mock.patch.object(rollout_base.PolicyRollout, "_output", recorded):
      grpo.run(config, workdir)
    metrics = writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    logged = [metrics[step]["train/rewards/overlong_penalty"]
              for step in range(4)]
    # DAPO's penalty with L_max 4 and L_cache 1: -1 at 4 tokens, else 0.
    want = [np.mean([-1.0 if n == 4 else 0.0 for n in step_lengths])
            for step_lengths in lengths]
    np.testing.assert_allclose(logged, want, atol=1e-6)
    self.assertLess(min(logged), 0.0)  # Some completions ran to the limit.

  def test_dapo_trains_on_informative_groups(self):
    config = grpo_config.get_config("dapo")
    config.train.steps = 2
    config.logging.tensorboard = False
    config.export.merged = False
    workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    with posttrain_testing.first_steps() as records:
      grpo.run(config, workdir)
    metrics = writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    first = metrics[0]
    print("DAPO dynamic sampling, first update:",
          {k: v for k, v in first.items() if "dynamic" in k})
    informative = np.any(np.asarray(records[0]["example"].advantages)
                         .reshape(-1, config.rl.num_generations) != 0, 1)
    self.assertAlmostEqual(float(informative.mean()),
                           first["train/dynamic_sampling/filled"])
    # The informative groups come first; more batches were sampled when
    # the first had uninformative ones (up to 3).
    kept = int(informative.sum())
    self.assertTrue(np.all(informative[:kept]))
    self.assertBetween(first["train/dynamic_sampling/rounds"], 1, 3)
    if first["train/dynamic_sampling/informative"] < 1:
      self.assertGreater(first["train/dynamic_sampling/rounds"], 1)

  def test_word_problems_source_trains_and_evaluates_on_its_sets(self):
    folder = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    config = grpo_config.get_config("smollm2_arithmetic")
    config.train.load = posttrain_testing.write_checkpoint(folder)
    config.data.source = "word_problems_easy"
    config.data.chat_template = posttrain_testing.template_file(folder)
    config.data.eval_every_steps = 1
    config.train.update(steps=1, batch_size=2)
    config.rl.num_generations = 2
    config.rollout.update(max_new_tokens=4, stop_tokens=())
    config.logging.tensorboard = False
    config.export.merged = False
    workdir = os.path.join(folder, "run")
    grpo.run(config, workdir)
    written = os.path.join(workdir, grpo.WORD_PROBLEMS_DIRNAME)
    self.assertCountEqual(os.listdir(written),
                          ["easy_train.jsonl", "easy_heldout.jsonl"])
    metrics = writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    self.assertTrue(any("eval/rewards/first_answer" in m
                        for m in metrics.values()), metrics)

  def test_a_sigterm_saves_the_policy_and_skips_the_export(self):
    config = grpo_config.get_config()
    config.train.steps = 4
    config.logging.tensorboard = False
    real_batches = grpo.train_batches

    def sigterm_at_batch_2(*args):
      for index, batch in enumerate(real_batches(*args)):
        if index == 2:
          os.kill(os.getpid(), signal.SIGTERM)
        yield batch

    workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    with mock.patch.object(grpo, "train_batches", sigterm_at_batch_2):
      result = grpo.run(config, workdir)
    self.assertTrue(result.preempted)
    self.assertEqual(result.exported, {})
    steps = result.trainer.train_steps
    self.assertBetween(steps, 1, 3)
    checkpoints = os.path.join(workdir, runtime.TUNIX_CHECKPOINT_DIRNAME)
    saved = [root for root, _, _ in os.walk(checkpoints)
             if os.path.basename(root) == str(steps)]
    self.assertNotEmpty(saved,
                        f"no checkpoint of step {steps} in {checkpoints}")
    self.assertFalse(os.path.exists(os.path.join(workdir, "export")))

  def test_a_separate_rollout_mesh_trains_like_a_shared_one(self):
    devices.require_devices(2)
    metrics = {}
    for split in (0, 1):
      config = grpo_config.get_config()
      config.train.steps = 2
      config.logging.tensorboard = False
      config.export.merged = False
      config.rollout.devices = split
      workdir = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
      grpo.run(config, workdir)
      metrics[split] = writers.read_jsonl(os.path.join(workdir,
                                                       "metrics.jsonl"))
    # The rollouts after an update are the same: the weights reached the
    # rollout mesh.
    for step in (0, 1):
      self.assertEqual(metrics[0][step]["train/rewards/sum"],
                       metrics[1][step]["train/rewards/sum"])
      self.assertEqual(metrics[0][step]["train/completions/mean_length"],
                       metrics[1][step]["train/completions/mean_length"])
    self.assertAlmostEqual(metrics[0][1]["train/actor/loss"],
                           metrics[1][1]["train/actor/loss"], places=5)

  def test_config_errors_name_the_key(self):
    for variant in grpo_config.VARIANTS:
      config = grpo_config.get_config(variant)
      config.train.load = "ckpt"
      config.data.files = "data.jsonl"
      RlRunConfig.from_config_dict(config)
    cases = [("rl", "loss_algo", "gspo", "rl.loss_algo='gspo' is invalid"),
             ("rl", "num_generations", 1, "rl.num_generations=1"),
             ("rollout", "engine", "sglang", "rollout.engine='sglang'"),
             ("train", "mini_batch_size", 3,
              "train.mini_batch_size=3 must divide"),
             ("rl", "loss_agg_mode", "mean",
              "rl.loss_agg_mode='mean' is invalid; valid: .'token-mean'"),
             ("rl", "advantage_estimator", "ppo",
              "rl.advantage_estimator='ppo' is invalid"),
             ("rl", "epsilon_high", -0.1, "rl.epsilon_high=-0.1 must be"),
             ("rl", "overlong_buffer", 2,
              "rl.overlong_buffer=2 is set but rl.rewards has no"
              " 'overlong_penalty'")]
    for section, key, value, message in cases:
      config = grpo_config.get_config()
      config[section][key] = value
      with self.assertRaisesRegex(ValueError, message):
        RlRunConfig.from_config_dict(config)
    config = grpo_config.get_config("dapo")
    config.rl.overlong_buffer = 5
    with self.assertRaisesRegex(ValueError, "rl.overlong_buffer=5 must be in"
                                " 1..rollout.max_new_tokens=4 with the"
                                " overlong_penalty reward"):
      RlRunConfig.from_config_dict(config)
    config = grpo_config.get_config("smollm2")
    with self.assertRaisesRegex(ValueError, "train.load is empty"):
      config.data.files = "data.jsonl"
      RlRunConfig.from_config_dict(config)


if __name__ == "__main__":
  absltest.main()
