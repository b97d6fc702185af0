"""Text generation with a KV cache: prefill the prompts, then one token per
step, the whole loop jitted (`jax.lax.while_loop`).

Batched prompts of different lengths are right-padded to the longest one;
row b's prompt fills cache slots 0..len_b-1 and its generated tokens go to
slots len_b, len_b+1, ... Padding never changes a row's result: a padded
slot is either masked (causal by position) or overwritten by the row's own
generated token before any query can see it, and a Gated DeltaNet layer's
state skips it (the prefill's `valid_BL`). A row stops at its EOS or any
other stop token (which is kept) or after `max_new_tokens`; the loop ends
when every row stopped. Tokens in `suppress_ids` (e.g. a padding token) are
never generated. The loop also returns the log-probability of each generated
token under the model at the sampling temperature (log_softmax(logits /
temperature), temperature 1 when greedy), before top-k, top-p and
suppression: what scoring the finished sequence gives.

Decoding runs the layers unrolled: with stacked layers (`scan_layers`), the
model is rebuilt inside the compiled program with a list of per-layer
modules over slices of the same weights, since XLA's layer scan copies
each layer's slice of the stacked weights out on every decode step
(SmolLM2-135M shape, 8 rows, CPU: 41 -> 66 tokens/s when sampling does not
sort the vocabulary; about 5 s more compilation).

One compilation per (batch, padded prompt length, max_new_tokens, numbers of
stop and suppressed tokens, paging settings); the sampling settings and the
seed are traced.
`pad_to` rounds the prompt length up to a multiple (a bucket), so batches of
varying prompt lengths share compilations (RL rollouts).

The KV cache is dense (`kv_cache="dense"`: [B, S] slots per layer) or paged
(`kv_cache="paged"`: `maxtext.layers.kv_cache.PagedKVCache`, a pool of
`num_pages` pages of `page_size` tokens per layer). Paged, a row holds the
pages of the positions it reached (`maxtext.inference.page_pool`: its
prompt's pages at prefill, one more page whenever it crosses into the next)
and gives them back when it stops, so a pool smaller than B * S / page_size
serves batches whose rows stop early or have short prompts; a pool that
runs out is an error naming `num_pages`. The pool's page table is the only
one: each model call takes it (`page_table_BN=`) and every layer reads its
pages through it, so no layer's cache carries a copy. Decode steps read the
pages with `maxtext.kernels.paged_attention` (`paged_attention_impl`). Both
caches generate the same tokens (log-probs within float rounding).

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import dataclasses
import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.common import layer_pattern
from maxtext.inference import page_pool
from maxtext.inference import sampler
from maxtext.kernels import paged_attention
from maxtext.layers import kv_cache as kv_cache_lib

KV_CACHES = ("dense", "paged")


@dataclasses.dataclass(frozen=True)
class _Paging:
  """How a paged cache is laid out (a static argument of `_generate`)."""

  page_size: int
  num_pages: int | None  # None: enough for every row to reach S.
  impl: str


def _pad(prompts: list[list[int]],
         pad_to: int = 1) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded tokens [B, L] (int32, padded with 0; L the longest prompt
  rounded up to a multiple of `pad_to`) and lengths [B]."""
  if not prompts or any(len(p) == 0 for p in prompts):
    raise ValueError("Every prompt needs at least one token.")
  lengths_B = np.array([len(p) for p in prompts], np.int32)
  padded = -(-int(lengths_B.max()) // pad_to) * pad_to
  tokens_BL = np.zeros((len(prompts), padded), np.int32)
  for row, prompt in enumerate(prompts):
    tokens_BL[row, :len(prompt)] = prompt
  return tokens_BL, lengths_B


def _unscanned(model):
  """`model` (a merged copy, changed in place) with its stacked block groups
  as lists of per-layer blocks over slices of the same weights."""
  cfg = model.cfg
  if not cfg.scan_layers:
    return model
  for kind, count in layer_pattern.kind_counts(cfg).items():
    graphdef, stacked_state = nnx.split(getattr(model, kind.name))
    setattr(model, kind.name, nnx.List([
        nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], stacked_state))
        for i in range(count)]))
  # Decoding never pipelines (`Decoder` pipelines only without a cache), so
  # the unscanned model may keep the execution it was built with.
  model.cfg = cfg.replace(scan_layers=False)
  return model


def _paged_cache(model, lengths_B, cache_length, paging):
  """(An empty `PagedKVCache` per layer, a pool with each row's prompt pages
  allocated: its page table is the one the layers read through)."""
  batch = lengths_B.shape[0]
  pages_per_row = -(-cache_length // paging.page_size)
  pool = page_pool.PagePool.create(
      batch, pages_per_row, paging.num_pages or batch * pages_per_row)
  pool = pool.allocate(jnp.arange(pages_per_row) * paging.page_size <
                       lengths_B[:, None])
  layers = jax.eval_shape(lambda: model.init_cache(batch, 1))
  cache = kv_cache_lib.paged_like(
      layers, num_pages=pool.free_P.shape[0] + 1, page_size=paging.page_size,
      impl=paging.impl)
  return cache, pool


def _page_table(pool):
  """The page table a paged cache is read through (None without a pool)."""
  return None if pool is None else pool.page_table_BN


def _prefill(model, tokens_BL, lengths_B, cache, page_table_BN=None,
             images_Bvhwe=None):
  """(logits [B, L, V], logits [B, V] at each row's last prompt token,
  cache); `page_table_BN` with a paged cache; `images_Bvhwe`: the prompts'
  images (a vision-language model)."""
  positions_BL = jnp.broadcast_to(jnp.arange(tokens_BL.shape[1]),
                                  tokens_BL.shape)
  images = {} if images_Bvhwe is None else {"images_Bvhwe": images_Bvhwe}
  logits_BLV, cache = model(tokens_BL, positions_BL, cache=cache,
                            page_table_BN=page_table_BN,
                            valid_BL=positions_BL < lengths_B[:, None],
                            **images)
  last_BV = jnp.take_along_axis(logits_BLV, (lengths_B - 1)[:, None, None],
                                axis=1)[:, 0]
  return logits_BLV, last_BV, cache


def _token_logprobs(logits_BV, token_B, params):
  """log_softmax(logits / temperature) at `token_B` (temperature 1 when
  greedy), float32 [B]."""
  temperature = jnp.where(params.temperature > 0, params.temperature, 1.0)
  logprobs_BV = jax.nn.log_softmax(logits_BV.astype(jnp.float32) /
                                   temperature, axis=-1)
  return jnp.take_along_axis(logprobs_BV, token_B[:, None], axis=-1)[:, 0]


@functools.partial(jax.jit,
                   static_argnames=("graphdef", "max_new_tokens", "paging"))
def _generate(graphdef, state, tokens_BL, lengths_B, key, params, stop_ids,
              suppress_ids, images_Bvhwe, *, max_new_tokens, paging):
  """Generated tokens [B, I] (0 after a row stopped), their log-probs
  [B, I] (0 after a row stopped), their counts [B] and whether the page
  pool ran out (False with a dense cache, `paging` None)."""
  model = _unscanned(nnx.merge(graphdef, state))
  batch = tokens_BL.shape[0]
  cache_length = tokens_BL.shape[1] + max_new_tokens
  if paging is None:
    cache, pool = model.init_cache(batch, cache_length), None
  else:
    cache, pool = _paged_cache(model, lengths_B, cache_length, paging)
  _, logits_BV, cache = _prefill(model, tokens_BL, lengths_B, cache,
                                 _page_table(pool), images_Bvhwe)

  def next_token(logits_BV, step):
    """(sampled token [B], its log-prob [B])."""
    token_B = sampler.sample(logits_BV.at[:, suppress_ids].set(-jnp.inf),
                             jax.random.fold_in(key, step), params)
    return token_B, _token_logprobs(logits_BV, token_B, params)

  token_B, logprob_B = next_token(logits_BV, 0)
  out_BI = jnp.zeros((batch, max_new_tokens), jnp.int32).at[:, 0].set(token_B)
  logprobs_BI = jnp.zeros((batch, max_new_tokens), jnp.float32).at[:, 0].set(
      logprob_B)
  done_B = jnp.isin(token_B, stop_ids)
  count_B = jnp.ones((batch,), jnp.int32)
  if pool is not None:
    pool = pool.release(done_B)

  def cond(carry):
    step, _, _, _, _, done_B, *_ = carry
    return (step < max_new_tokens) & ~jnp.all(done_B)

  def body(carry):
    (step, cache, pool, token_B, position_B, done_B, out_BI, logprobs_BI,
     count_B) = carry
    if pool is not None:
      pool = pool.allocate_positions(position_B, paging.page_size, ~done_B)
    logits_B1V, cache = model(token_B[:, None], position_B[:, None],
                              cache=cache, page_table_BN=_page_table(pool))
    logits_BV = logits_B1V[:, 0]
    token_B, logprob_B = next_token(logits_BV, step)
    token_B = jnp.where(done_B, 0, token_B)
    logprob_B = jnp.where(done_B, 0.0, logprob_B)
    out_BI = out_BI.at[:, step].set(token_B)
    logprobs_BI = logprobs_BI.at[:, step].set(logprob_B)
    count_B = count_B + (~done_B).astype(jnp.int32)
    stopped_B = ~done_B & jnp.isin(token_B, stop_ids)
    if pool is not None:
      pool = pool.release(stopped_B)
    return (step + 1, cache, pool, token_B, position_B + 1,
            done_B | stopped_B, out_BI, logprobs_BI, count_B)

  carry = (jnp.int32(1), cache, pool, token_B, lengths_B, done_B, out_BI,
           logprobs_BI, count_B)
  _, _, pool, *_, out_BI, logprobs_BI, count_B = jax.lax.while_loop(
      cond, body, carry)
  return (out_BI, logprobs_BI, count_B,
          jnp.bool_(False) if pool is None else pool.overflow)


def _paging(model, kv_cache, page_size, num_pages, impl) -> _Paging | None:
  """The static paging settings (None for a dense cache), checked."""
  if kv_cache not in KV_CACHES:
    raise ValueError(f"kv_cache={kv_cache!r} is invalid; valid: "
                     f"{list(KV_CACHES)}.")
  if kv_cache == "dense":
    return None
  if page_size < 1:
    raise ValueError(f"page_size={page_size} must be >= 1.")
  if num_pages is not None and num_pages < 1:
    raise ValueError(f"num_pages={num_pages} must be >= 1 (or None).")
  if impl not in paged_attention.IMPLS:
    raise ValueError(f"paged_attention_impl={impl!r} is invalid; valid: "
                     f"{list(paged_attention.IMPLS)}.")
  return _Paging(page_size, num_pages, impl)


def generate_with_logprobs(
    model: nnx.Module,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    params: sampler.SamplingParams = sampler.SamplingParams(),
    stop_ids: tuple[int, ...] = (),
    suppress_ids: tuple[int, ...] = (),
    seed: int = 0,
    pad_to: int = 1,
    kv_cache: str = "dense",
    page_size: int = 16,
    num_pages: int | None = None,
    paged_attention_impl: str = "auto",
    images: np.ndarray | None = None,
) -> tuple[list[list[int]], list[np.ndarray]]:
  """Generates up to `max_new_tokens` tokens after each prompt.

  Args:
    model: A decoder (`maxtext.models.decoder.Decoder`).
    prompts: Token ids, one list per row, of any lengths.
    max_new_tokens: Most tokens generated per row.
    params: Greedy (the default) or sampling settings.
    stop_ids: A row stops after generating any of these tokens (kept).
    suppress_ids: Tokens never generated.
    seed: Seed of the sampling.
    pad_to: The prompts are padded to a multiple of this length, so prompt
      lengths in one bucket share a compilation.
    kv_cache: One of `KV_CACHES` (see the module docstring).
    page_size: Tokens per page of a paged cache.
    num_pages: Pages in the pool of a paged cache; None: enough for every
      row to reach the padded prompt length + `max_new_tokens`.
    paged_attention_impl: The `paged_attention.IMPLS` entry that reads a
      paged cache at decode steps.
    images: For a vision-language model, each row's images [B, v, h, w, e]
      (`maxtext.data.images`), whose placeholders the prompts hold.

  Returns:
    (tokens, logprobs): the generated tokens of each row, and their float32
    log-probabilities (see the module docstring).

  Raises:
    ValueError: An argument is out of range, a paged cache was asked of a
      model with multi-head latent attention, or the page pool ran out.
  """
  if max_new_tokens < 1:
    raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1.")
  if pad_to < 1:
    raise ValueError(f"pad_to={pad_to} must be >= 1.")
  paging = _paging(model, kv_cache, page_size, num_pages,
                   paged_attention_impl)
  params = params.validate()
  tokens_BL, lengths_B = _pad(prompts, pad_to)
  graphdef, state = nnx.split(model)
  traced = sampler.SamplingParams(
      jnp.float32(params.temperature), jnp.int32(params.top_k),
      jnp.float32(params.top_p))
  out_BI, logprobs_BI, count_B, overflow = _generate(
      graphdef, state, jnp.asarray(tokens_BL), jnp.asarray(lengths_B),
      jax.random.key(seed), traced,
      jnp.asarray(list(stop_ids) or [-1], jnp.int32),
      jnp.asarray(list(suppress_ids), jnp.int32),
      None if images is None else jnp.asarray(images),
      max_new_tokens=max_new_tokens, paging=paging)
  if overflow:
    raise ValueError(
        f"The paged KV cache ran out of pages (num_pages={num_pages}, "
        f"page_size={page_size}): give more pages, or num_pages=None for "
        "enough for every row.")
  out_BI, logprobs_BI, count_B = (np.asarray(out_BI), np.asarray(logprobs_BI),
                                  np.asarray(count_B))
  rows = range(len(prompts))
  return ([out_BI[row, :count_B[row]].tolist() for row in rows],
          [logprobs_BI[row, :count_B[row]] for row in rows])


def generate(
    model: nnx.Module,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    params: sampler.SamplingParams = sampler.SamplingParams(),
    eos_id: int | None = None,
    seed: int = 0,
    kv_cache: str = "dense",
    page_size: int = 16,
    num_pages: int | None = None,
    paged_attention_impl: str = "auto",
    images: np.ndarray | None = None,
) -> list[list[int]]:
  """Generates up to `max_new_tokens` tokens after each prompt.

  Args:
    model: A decoder (`maxtext.models.decoder.Decoder`).
    prompts: Token ids, one list per row, of any lengths.
    max_new_tokens: Most tokens generated per row.
    params: Greedy (the default) or sampling settings.
    eos_id: A row stops after generating this token (kept); None: never.
    seed: Seed of the sampling.
    kv_cache: See `generate_with_logprobs`.
    page_size: See `generate_with_logprobs`.
    num_pages: See `generate_with_logprobs`.
    paged_attention_impl: See `generate_with_logprobs`.
    images: See `generate_with_logprobs`.

  Returns:
    The generated tokens of each row.
  """
  tokens, _ = generate_with_logprobs(
      model, prompts, max_new_tokens=max_new_tokens, params=params,
      stop_ids=() if eos_id is None else (eos_id,), seed=seed,
      kv_cache=kv_cache, page_size=page_size, num_pages=num_pages,
      paged_attention_impl=paged_attention_impl, images=images)
  return tokens


@nnx.jit
def _prefill_logits(model, tokens_1L, images_1vhwe):
  length = tokens_1L.shape[1]
  logits_1LV, _, _ = _prefill(model, tokens_1L, jnp.array([length]),
                              model.init_cache(1, length),
                              images_Bvhwe=images_1vhwe)
  return logits_1LV[0]


def prefill_logits(model: nnx.Module, token_ids: list[int],
                   images: np.ndarray | None = None) -> np.ndarray:
  """float32 logits [L, V] of the prompt `token_ids` (with its `images`
  [v, h, w, e], a vision-language model), from the cached prefill that
  generation runs."""
  tokens_1L, _ = _pad([token_ids])
  images_1vhwe = None if images is None else jnp.asarray(images)[None]
  return np.asarray(_prefill_logits(model, jnp.asarray(tokens_1L),
                                    images_1vhwe), np.float32)
