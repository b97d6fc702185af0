"""Text generation with a KV cache: prefill the prompts, then one token per
step, the whole loop jitted (`jax.lax.while_loop`).

Batched prompts of different lengths are right-padded to the longest one;
row b's prompt fills cache slots 0..len_b-1 and its generated tokens go to
slots len_b, len_b+1, ... Padding never changes a row's result: a padded
slot is either masked (causal by position) or overwritten by the row's own
generated token before any query can see it. A row stops at its EOS (which
is kept) or after `max_new_tokens`; the loop ends when every row stopped.

One compilation per (batch, longest prompt, max_new_tokens); the sampling
settings and the seed are traced.

Shape key: B batch, P longest prompt, T max new tokens, S = P + T cache
length, V vocab.
"""

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.inference import sampler


def _pad(prompts: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded tokens [B, P] (int32, padded with 0) and lengths [B]."""
  if not prompts or any(len(p) == 0 for p in prompts):
    raise ValueError("Every prompt needs at least one token.")
  lengths_B = np.array([len(p) for p in prompts], np.int32)
  tokens_BP = np.zeros((len(prompts), lengths_B.max()), np.int32)
  for row, prompt in enumerate(prompts):
    tokens_BP[row, :len(prompt)] = prompt
  return tokens_BP, lengths_B


def _prefill(model, tokens_BP, lengths_B, cache_length):
  """(logits [B, V] at each row's last prompt token, cache)."""
  batch, prompt_length = tokens_BP.shape
  positions_BP = jnp.broadcast_to(jnp.arange(prompt_length), tokens_BP.shape)
  cache = model.init_cache(batch, cache_length)
  logits_BPV, cache = model(tokens_BP, positions_BP, cache=cache)
  last_BV = jnp.take_along_axis(logits_BPV, (lengths_B - 1)[:, None, None],
                                axis=1)[:, 0]
  return logits_BPV, last_BV, cache


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens"))
def _generate(graphdef, state, tokens_BP, lengths_B, key, params, eos_id, *,
              max_new_tokens):
  """Generated tokens [B, T] (0 after a row stopped) and their counts [B]."""
  model = nnx.merge(graphdef, state)
  batch = tokens_BP.shape[0]
  _, logits_BV, cache = _prefill(model, tokens_BP, lengths_B,
                                 tokens_BP.shape[1] + max_new_tokens)
  token_B = sampler.sample(logits_BV, jax.random.fold_in(key, 0), params)
  out_BT = jnp.zeros((batch, max_new_tokens), jnp.int32).at[:, 0].set(token_B)
  done_B = token_B == eos_id
  count_B = jnp.ones((batch,), jnp.int32)

  def cond(carry):
    step, _, _, _, done_B, _, _ = carry
    return (step < max_new_tokens) & ~jnp.all(done_B)

  def body(carry):
    step, cache, token_B, position_B, done_B, out_BT, count_B = carry
    logits_B1V, cache = model(token_B[:, None], position_B[:, None],
                              cache=cache)
    token_B = sampler.sample(logits_B1V[:, 0],
                             jax.random.fold_in(key, step), params)
    token_B = jnp.where(done_B, 0, token_B)
    out_BT = out_BT.at[:, step].set(token_B)
    count_B = count_B + (~done_B).astype(jnp.int32)
    done_B = done_B | (token_B == eos_id)
    return step + 1, cache, token_B, position_B + 1, done_B, out_BT, count_B

  carry = (jnp.int32(1), cache, token_B, lengths_B, done_B, out_BT, count_B)
  *_, out_BT, count_B = jax.lax.while_loop(cond, body, carry)
  return out_BT, count_B


def generate(
    model: nnx.Module,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    params: sampler.SamplingParams = sampler.SamplingParams(),
    eos_id: int | None = None,
    seed: int = 0,
) -> list[list[int]]:
  """Generates up to `max_new_tokens` tokens after each prompt.

  Args:
    model: A decoder (`maxtext.models.decoder.Decoder`).
    prompts: Token ids, one list per row, of any lengths.
    max_new_tokens: Most tokens generated per row.
    params: Greedy (the default) or sampling settings.
    eos_id: A row stops after generating this token (kept); None: never.
    seed: Seed of the sampling.

  Returns:
    The generated tokens of each row.
  """
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1.")
  params = params.validate()
  tokens_BP, lengths_B = _pad(prompts)
  graphdef, state = nnx.split(model)
  traced = sampler.SamplingParams(
      jnp.float32(params.temperature), jnp.int32(params.top_k),
      jnp.float32(params.top_p))
  out_BT, count_B = _generate(
      graphdef, state, jnp.asarray(tokens_BP), jnp.asarray(lengths_B),
      jax.random.key(seed), traced, jnp.int32(-1 if eos_id is None else eos_id),
      max_new_tokens=max_new_tokens)
  out_BT, count_B = np.asarray(out_BT), np.asarray(count_B)
  return [out_BT[row, :count_B[row]].tolist() for row in range(len(prompts))]


@nnx.jit
def _prefill_logits(model, tokens_1L):
  length = tokens_1L.shape[1]
  logits_1LV, _, _ = _prefill(model, tokens_1L, jnp.array([length]), length)
  return logits_1LV[0]


def prefill_logits(model: nnx.Module, token_ids: list[int]) -> np.ndarray:
  """float32 logits [L, V] of the prompt `token_ids`, from the cached
  prefill that generation runs."""
  tokens_1L, _ = _pad([token_ids])
  return np.asarray(_prefill_logits(model, jnp.asarray(tokens_1L)),
                    np.float32)
