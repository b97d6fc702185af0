"""The DPO and ORPO losses, written from their papers.

`loss(model, train_example, algorithm, beta, lambda_orpo, label_smoothing)`
is the loss our DPO/ORPO trainer (Tunix's `DPOTrainer`, fed by
`maxtext.posttrain.dpo`) trains on, in place of Tunix's `dpo_loss_fn`
(same arguments, same metrics). From one batch of preference pairs (the
chosen responses' rows, then the rejected ones'), the policy's per-token
log-probabilities of the responses give, per pair, the summed
log-likelihoods log pi(y_w | x), log pi(y_l | x) and the response lengths
|y_w|, |y_l|; then

DPO (Rafailov et al. 2023, eq. 7; label smoothing eps as in cDPO, Mitchell
2023), with the reference model's summed log-likelihoods (precomputed once
per batch slice by the trainer; 0 without a reference):
  h = beta * [(log pi(y_w) - log ref(y_w)) - (log pi(y_l) - log ref(y_l))]
  loss = -(1 - eps) log sigmoid(h) - eps log sigmoid(-h)
  rewards/chosen = beta (log pi(y_w) - log ref(y_w)), rewards/rejected
  likewise, margin = their difference, accuracy = margin > 0.

ORPO (Hong et al. 2024, eqs. 2-7): with the length-normalised likelihood
P(y | x) = exp(log pi(y | x) / |y|) and odds(y | x) = P / (1 - P),
  L_SFT = -log pi(y_w | x) / |y_w|  (the chosen response's mean NLL)
  L_OR = -(1 - eps) log sigmoid(r) - eps log sigmoid(-r),
         r = log odds(y_w | x) - log odds(y_l | x)
  loss = L_SFT + lambda * L_OR
  rewards/chosen = lambda log pi(y_w | x) / |y_w| (as TRL logs them), ...,
  odds_ratio = exp(r).
log(1 - P) is computed as log(-expm1(log P)). (Tunix 0.1.7's
`dpo_loss_fn` puts the summed log-likelihood in the odds, not the paper's
length-normalised one, so its odds ratio depends on response lengths.)

Each loss is the mean over the batch's pairs.
"""

from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
from tunix.rl import common

ALGORITHMS = ("dpo", "orpo")


def sequence_logps(model: nnx.Module, example: Any
                   ) -> tuple[jax.Array, jax.Array]:
  """(summed log-likelihood, length) of each row's response in `example`
  (a Tunix DPO `TrainExample`), [2 pairs] each."""
  token_logps = common.get_per_token_logps(
      model, input_tokens=example.input_ids, positions=example.positions,
      attn_mask=example.attention_mask,
      logits_to_keep=example.logits_to_keep, images=example.images)
  mask = example.completion_mask.astype(token_logps.dtype)
  return (token_logps * mask).sum(axis=-1), mask.sum(axis=-1)


def _smoothed(logit: jax.Array, label_smoothing: float) -> jax.Array:
  return -(jax.nn.log_sigmoid(logit) * (1.0 - label_smoothing)
           + jax.nn.log_sigmoid(-logit) * label_smoothing)


def dpo_terms(chosen: jax.Array, rejected: jax.Array,
              ref_chosen: jax.Array | None, ref_rejected: jax.Array | None,
              *, beta: float, label_smoothing: float
              ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """DPO's per-pair losses and metrics from summed log-likelihoods."""
  chosen_ratio = chosen - (0.0 if ref_chosen is None else ref_chosen)
  rejected_ratio = rejected - (0.0 if ref_rejected is None else ref_rejected)
  chosen_rewards, rejected_rewards = beta * chosen_ratio, beta * rejected_ratio
  losses = _smoothed(chosen_rewards - rejected_rewards, label_smoothing)
  return losses, _reward_metrics(chosen_rewards, rejected_rewards, chosen,
                                 rejected)


def orpo_terms(chosen: jax.Array, rejected: jax.Array,
               chosen_length: jax.Array, rejected_length: jax.Array, *,
               lambda_orpo: float, label_smoothing: float
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """ORPO's per-pair losses and metrics from summed log-likelihoods and
  response lengths."""
  chosen_mean = chosen / jnp.maximum(chosen_length, 1.0)
  rejected_mean = rejected / jnp.maximum(rejected_length, 1.0)

  def log_odds(mean_logp):
    return mean_logp - jnp.log(-jnp.expm1(mean_logp))

  ratio = log_odds(chosen_mean) - log_odds(rejected_mean)
  sft_loss = -chosen_mean
  or_loss = _smoothed(ratio, label_smoothing)
  metrics = _reward_metrics(lambda_orpo * chosen_mean,
                            lambda_orpo * rejected_mean, chosen, rejected)
  metrics.update(odds_ratio=jnp.exp(ratio).mean(), sft_loss=sft_loss.mean(),
                 or_loss=or_loss.mean())
  return sft_loss + lambda_orpo * or_loss, metrics


def _reward_metrics(chosen_rewards, rejected_rewards, chosen, rejected):
  margin = chosen_rewards - rejected_rewards
  return {"rewards/chosen": chosen_rewards.mean(),
          "rewards/rejected": rejected_rewards.mean(),
          "rewards/margin": margin.mean(),
          "rewards/accuracy": (margin > 0).mean(),
          "log_probs/chosen": chosen.mean(),
          "log_probs/rejected": rejected.mean()}


def loss(model: nnx.Module, train_example: Any, algorithm: str = "dpo",
         beta: float = 0.1, lambda_orpo: float = 0.1,
         label_smoothing: float = 0.0
         ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The DPO or ORPO loss of `model` on a Tunix DPO `TrainExample` (see
  the module docstring) and its metrics."""
  logps, lengths = sequence_logps(model, train_example)
  pairs = logps.shape[0] // 2
  chosen, rejected = logps[:pairs], logps[pairs:]
  if algorithm == "orpo":
    losses, metrics = orpo_terms(chosen, rejected, lengths[:pairs],
                                 lengths[pairs:], lambda_orpo=lambda_orpo,
                                 label_smoothing=label_smoothing)
  else:
    losses, metrics = dpo_terms(chosen, rejected,
                                train_example.ref_chosen_logps,
                                train_example.ref_rejected_logps, beta=beta,
                                label_smoothing=label_smoothing)
  return losses.mean(), metrics
