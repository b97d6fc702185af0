"""Tests of maxtext.posttrain.preference_loss against numpy implementations
of the published DPO and ORPO formulas on fixed log-likelihoods (losses,
implicit rewards, margins, odds ratio, gradient signs), through a tiny
model's forward pass, and that a DPO run computes the reference's
log-likelihoods once per pair (each gradient-accumulation slice its own)."""

import os
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
from tunix.rl import common
from tunix.sft.dpo import dpo_trainer

from maxtext.posttrain import base_model
from maxtext.posttrain import posttrain_testing as pt
from maxtext.posttrain import preference_loss
from maxtext.posttrain import sft

# Four pairs' summed log-likelihoods and response lengths.
_CHOSEN = np.array([-4.0, -12.5, -0.3, -30.0], np.float32)
_REJECTED = np.array([-6.0, -9.0, -2.0, -31.0], np.float32)
_REF_CHOSEN = np.array([-5.0, -12.0, -0.5, -28.0], np.float32)
_REF_REJECTED = np.array([-5.5, -10.0, -1.0, -33.0], np.float32)
_CHOSEN_LENGTH = np.array([4.0, 10.0, 1.0, 60.0], np.float32)
_REJECTED_LENGTH = np.array([3.0, 9.0, 2.0, 40.0], np.float32)


def _log_sigmoid(x):
  return -np.logaddexp(0.0, -x)


def _numpy_dpo(beta, eps, ref=True):
  """Rafailov et al. 2023, eq. 7, with cDPO's label smoothing eps."""
  chosen = _CHOSEN - (_REF_CHOSEN if ref else 0.0)
  rejected = _REJECTED - (_REF_REJECTED if ref else 0.0)
  h = beta * (chosen - rejected)
  losses = -(1 - eps) * _log_sigmoid(h) - eps * _log_sigmoid(-h)
  return losses, beta * chosen, beta * rejected


def _numpy_orpo(lam, eps):
  """Hong et al. 2024, eqs. 2-7 (length-normalised likelihood in the
  odds)."""
  p_w = np.exp(_CHOSEN / _CHOSEN_LENGTH)
  p_l = np.exp(_REJECTED / _REJECTED_LENGTH)
  ratio = np.log(p_w / (1 - p_w)) - np.log(p_l / (1 - p_l))
  l_or = -(1 - eps) * _log_sigmoid(ratio) - eps * _log_sigmoid(-ratio)
  l_sft = -_CHOSEN / _CHOSEN_LENGTH
  return l_sft + lam * l_or, l_sft, l_or, ratio


class FormulaTest(parameterized.TestCase):

  @parameterized.parameters((0.1, 0.0, True), (0.5, 0.2, True),
                            (0.1, 0.0, False))
  def test_dpo_equals_the_published_formula(self, beta, eps, ref):
    losses, metrics = preference_loss.dpo_terms(
        jnp.asarray(_CHOSEN), jnp.asarray(_REJECTED),
        jnp.asarray(_REF_CHOSEN) if ref else None,
        jnp.asarray(_REF_REJECTED) if ref else None, beta=beta,
        label_smoothing=eps)
    want, chosen_rewards, rejected_rewards = _numpy_dpo(beta, eps, ref)
    np.testing.assert_allclose(losses, want, rtol=1e-6)
    margin = chosen_rewards - rejected_rewards
    np.testing.assert_allclose(metrics["rewards/chosen"],
                               chosen_rewards.mean(), rtol=1e-6)
    np.testing.assert_allclose(metrics["rewards/rejected"],
                               rejected_rewards.mean(), rtol=1e-6)
    np.testing.assert_allclose(metrics["rewards/margin"], margin.mean(),
                               rtol=1e-5)
    self.assertEqual(float(metrics["rewards/accuracy"]),
                     float((margin > 0).mean()))

  @parameterized.parameters((0.1, 0.0), (1.0, 0.1))
  def test_orpo_equals_the_published_formula(self, lam, eps):
    losses, metrics = preference_loss.orpo_terms(
        jnp.asarray(_CHOSEN), jnp.asarray(_REJECTED),
        jnp.asarray(_CHOSEN_LENGTH), jnp.asarray(_REJECTED_LENGTH),
        lambda_orpo=lam, label_smoothing=eps)
    want, l_sft, l_or, ratio = _numpy_orpo(lam, eps)
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    np.testing.assert_allclose(metrics["sft_loss"], l_sft.mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["or_loss"], l_or.mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["odds_ratio"], np.exp(ratio).mean(),
                               rtol=1e-5)
    np.testing.assert_allclose(
        metrics["rewards/margin"],
        (lam * (_CHOSEN / _CHOSEN_LENGTH - _REJECTED / _REJECTED_LENGTH)
         ).mean(), rtol=1e-5)

  def test_gradients_raise_the_chosen_and_lower_the_rejected(self):

    def dpo(chosen, rejected):
      return preference_loss.dpo_terms(
          chosen, rejected, jnp.asarray(_REF_CHOSEN),
          jnp.asarray(_REF_REJECTED), beta=0.1, label_smoothing=0.0)[0].sum()

    def orpo(chosen, rejected):
      return preference_loss.orpo_terms(
          chosen, rejected, jnp.asarray(_CHOSEN_LENGTH),
          jnp.asarray(_REJECTED_LENGTH), lambda_orpo=0.1,
          label_smoothing=0.0)[0].sum()

    for fn in (dpo, orpo):
      d_chosen, d_rejected = jax.grad(fn, argnums=(0, 1))(
          jnp.asarray(_CHOSEN), jnp.asarray(_REJECTED))
      # Descent raises log pi(y_w) and lowers log pi(y_l).
      self.assertTrue(np.all(np.asarray(d_chosen) < 0), fn.__name__)
      self.assertTrue(np.all(np.asarray(d_rejected) > 0), fn.__name__)


class ModelLossTest(absltest.TestCase):

  def test_loss_of_a_model_equals_numpy_from_its_logits(self):
    folder = self.create_tempdir().full_path
    model = base_model.load_model(pt.write_checkpoint(folder)).model
    rng = np.random.default_rng(0)
    pairs, prompt, response = 3, 5, 4
    prompt_ids = rng.integers(1, 90, (pairs, prompt))
    chosen_ids = rng.integers(1, 90, (pairs, response))
    rejected_ids = rng.integers(1, 90, (pairs, response))
    chosen_mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    rejected_mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    ids = np.concatenate([np.concatenate([prompt_ids, chosen_ids], 1),
                          np.concatenate([prompt_ids, rejected_ids], 1)])
    completion_mask = np.concatenate([chosen_mask, rejected_mask])
    mask = np.concatenate([np.ones((2 * pairs, prompt)), completion_mask], 1)
    example = dpo_trainer.TrainExample(
        input_ids=jnp.asarray(ids),
        positions=common.build_positions_from_mask(jnp.asarray(mask)),
        attention_mask=common.make_causal_attn_mask(jnp.asarray(mask)),
        ref_chosen_logps=None, ref_rejected_logps=None,
        completion_mask=jnp.asarray(completion_mask), logits_to_keep=response,
        images=None)
    logits, _ = model(example.input_ids, positions=example.positions,
                      attention_mask=example.attention_mask, cache=None)
    logits = np.asarray(logits, np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    # Token t of the response is scored by the logits at t - 1.
    token = np.take_along_axis(log_probs[:, prompt - 1:-1],
                               ids[:, prompt:, None], -1)[..., 0]
    sums = (token * completion_mask).sum(-1)
    lengths = completion_mask.sum(-1)
    got, aux = preference_loss.loss(model, example, algorithm="orpo",
                                    lambda_orpo=0.5)
    mean_w, mean_l = sums[:pairs] / lengths[:pairs], sums[pairs:] / lengths[
        pairs:]
    ratio = (mean_w - np.log1p(-np.exp(mean_w))) - (
        mean_l - np.log1p(-np.exp(mean_l)))
    want = (-mean_w + 0.5 * -_log_sigmoid(ratio)).mean()
    # The losses take differences of sums of log-probabilities (~20) over
    # the vocabulary's log-sum-exps: within 1e-4 relative.
    np.testing.assert_allclose(float(got), want, rtol=1e-4)
    np.testing.assert_allclose(aux["log_probs/chosen"], sums[:pairs].mean(),
                               rtol=1e-5)
    got, _ = preference_loss.loss(model, example, algorithm="dpo", beta=0.3)
    want = -_log_sigmoid(0.3 * (sums[:pairs] - sums[pairs:])).mean()
    np.testing.assert_allclose(float(got), want, rtol=1e-4)


class ReferenceOnceTest(absltest.TestCase):

  def test_reference_scores_each_pair_once_with_accumulation(self):
    folder = self.create_tempdir().full_path
    ckpt = pt.write_checkpoint(folder)
    records = [{"prompt": f"{pt.word(i % 8)}", "chosen": pt.word(20 + i % 5),
                "rejected": pt.word(60 + i % 5)} for i in range(16)]
    config = pt.dpo_test_config(
        folder, ckpt, steps=2, method="dpo",
        train_file=pt.write_jsonl(os.path.join(folder, "train.jsonl"),
                                  records))
    config.train.microbatches = 2
    rows = []
    original = dpo_trainer.compute_logps

    def counted(model, input_ids, *args, **kwargs):
      rows.append(int(input_ids.shape[0]))
      return original(model, input_ids, *args, **kwargs)

    # Our loss scores the policy itself: compute_logps is the reference's.
    with mock.patch.object(dpo_trainer, "compute_logps", counted):
      sft.run(config, os.path.join(folder, "run"))
    # 2 updates x 2 slices, each its 4 pairs' chosen and rejected rows.
    self.assertEqual(rows, [8, 8, 8, 8])


if __name__ == "__main__":
  absltest.main()
