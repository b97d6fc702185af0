"""Choosing the next token from logits: greedy, temperature, top-k, top-p.

All settings are traced values (`SamplingParams`), so one compiled
generation loop serves every setting. The filters follow Hugging Face's
order: logits / temperature, then top-k, then top-p over what top-k kept.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How to pick tokens.

  Attributes:
    temperature: 0 picks the most likely token (greedy); otherwise logits
      are divided by it before sampling.
    top_k: Sample among the k most likely tokens; 0 is off.
    top_p: Sample from the nucleus: the fewest most likely tokens whose
      probabilities add up to at least top_p; 1 is off.
  """

  temperature: float | jax.Array = 0.0
  top_k: int | jax.Array = 0
  top_p: float | jax.Array = 1.0

  def validate(self) -> "SamplingParams":
    """Returns self; ValueError naming the field out of range."""
    if self.temperature < 0:
      raise ValueError(f"temperature={self.temperature} must be >= 0.")
    if self.top_k < 0:
      raise ValueError(f"top_k={self.top_k} must be >= 0 (0 is off).")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p={self.top_p} must be in (0, 1].")
    return self


def filtered_logits(logits_BV: jax.Array,
                    params: SamplingParams) -> jax.Array:
  """float32 logits / temperature with tokens outside top-k and the top-p
  nucleus set to -inf (temperature 0 is treated as 1 here).

  The filters sort the vocabulary; with both off (the traced settings say
  so) the sort is skipped at run time.
  """
  temperature = jnp.where(params.temperature > 0, params.temperature, 1.0)
  logits_BV = logits_BV.astype(jnp.float32) / temperature
  return jax.lax.cond((params.top_k > 0) | (params.top_p < 1), _top_k_top_p,
                      lambda logits_BV, _: logits_BV, logits_BV, params)


def _top_k_top_p(logits_BV: jax.Array, params: SamplingParams) -> jax.Array:
  vocab = logits_BV.shape[-1]
  order_BV = jnp.argsort(-logits_BV, axis=-1, stable=True)
  sorted_BV = jnp.take_along_axis(logits_BV, order_BV, axis=-1)
  rank_V = jnp.arange(vocab)
  top_k = jnp.where(params.top_k > 0, params.top_k, vocab)
  keep_BV = rank_V[None, :] < top_k
  sorted_BV = jnp.where(keep_BV, sorted_BV, -jnp.inf)
  probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
  # Keep a token when the tokens before it hold less than top_p.
  before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV
  keep_BV &= (before_BV < params.top_p) | (rank_V[None, :] == 0)
  keep_sorted_BV = keep_BV
  keep_BV = jnp.zeros_like(keep_sorted_BV).at[
      jnp.arange(logits_BV.shape[0])[:, None], order_BV].set(keep_sorted_BV)
  return jnp.where(keep_BV, logits_BV, -jnp.inf)


def sample(logits_BV: jax.Array, key: jax.Array,
           params: SamplingParams) -> jax.Array:
  """Next token ids [B] (int32); greedy decoding skips the filters."""
  def greedy(logits_BV, key, params):
    del key, params
    return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)

  def sampled(logits_BV, key, params):
    return jax.random.categorical(
        key, filtered_logits(logits_BV, params), axis=-1).astype(jnp.int32)

  return jax.lax.cond(params.temperature > 0, sampled, greedy, logits_BV, key,
                      params)
