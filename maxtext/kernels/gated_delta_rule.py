"""The gated delta rule: Gated DeltaNet's token mixer (Yang et al. 2024,
"Gated Delta Networks"; Qwen3-Next, Qwen3.5).

Each head carries a state S [K, U] (keys to values, zero at the start of
every sequence). Token t, with query q_t, key k_t (both L2-normalised by the
caller, the query also scaled), value v_t, log-decay g_t <= 0 and write
strength beta_t in (0, 1), decays the state, then moves what it recalls for
k_t towards v_t, and reads it with q_t:

  S <- exp(g_t) S
  S <- S + k_t (beta_t (v_t - S^T k_t))^T
  o_t = S^T q_t

`reference` runs exactly that, token by token (`step` is one token: the
recurrent form decoding uses). `chunked` computes the same in chunks of C
tokens, work and memory linear in the length: within a chunk the updates
are solved at once (the WY form: a unit lower-triangular system of C x C
per chunk, solved by matmuls only, `unit_lower_inverse`), and only the
state passes between chunks (a scan over L / C chunks). Both take packed sequences (`segment_ids_BL`: the state restarts
from zero at each new segment) and an initial state (a decoding cache), and
return the final state; a length that is not a multiple of C is padded
with inert tokens (beta = 0, g = 0 leave the state unchanged).

All arithmetic is float32. Shape suffixes: `maxtext.common.axes.SHAPE_KEY`
(H the delta rule's heads, K their key width, U their value width).
"""

import jax
import jax.numpy as jnp


def unit_lower_inverse(a_xCC: jax.Array) -> jax.Array:
  """(I + A)^-1 of strictly lower-triangular A [..., C, C], by matmuls only.

  -A is nilpotent ((-A)^C = 0), so (I + A)^-1 = sum_{j < C} (-A)^j =
  (I - A)(I + A^2)(I + A^4)...: ceil(log2 C) - 1 squarings and as many
  products. Not `lax.linalg.triangular_solve`: on CPU that is a LAPACK call,
  and XLA's CPU runtime deadlocked running several of them concurrently in
  a training step (a Qwen3-Next step hung at 0 % CPU, one device or eight).
  """
  size = a_xCC.shape[-1]
  inverse_xCC = jnp.eye(size, dtype=a_xCC.dtype) - a_xCC
  power_xCC = -a_xCC
  covered = 2  # inverse_xCC holds the terms (-A)^j for j < covered.
  while covered < size:
    power_xCC = power_xCC @ power_xCC
    inverse_xCC = inverse_xCC + inverse_xCC @ power_xCC
    covered *= 2
  return inverse_xCC


def step(state_BHKU: jax.Array, q_BHK: jax.Array, k_BHK: jax.Array,
         v_BHU: jax.Array, g_BH: jax.Array, beta_BH: jax.Array
         ) -> tuple[jax.Array, jax.Array]:
  """One token: (output [B, H, U], new state [B, H, K, U]), float32."""
  state_BHKU = state_BHKU * jnp.exp(g_BH)[..., None, None]
  recalled_BHU = jnp.einsum("bhku,bhk->bhu", state_BHKU, k_BHK)
  delta_BHU = (v_BHU - recalled_BHU) * beta_BH[..., None]
  state_BHKU = state_BHKU + k_BHK[..., :, None] * delta_BHU[..., None, :]
  return jnp.einsum("bhku,bhk->bhu", state_BHKU, q_BHK), state_BHKU


def _inputs(q_BLHK, k_BLHK, v_BLHU, g_BLH, beta_BLH, segment_ids_BL,
            state_BHKU):
  """The arguments in float32, segment ids (zeros when None) and the
  initial state (zeros when None)."""
  f32 = [x.astype(jnp.float32) for x in (q_BLHK, k_BLHK, v_BLHU, g_BLH,
                                         beta_BLH)]
  batch, length, heads, key_dim = q_BLHK.shape
  if segment_ids_BL is None:
    segment_ids_BL = jnp.zeros((batch, length), jnp.int32)
  if state_BHKU is None:
    state_BHKU = jnp.zeros((batch, heads, key_dim, v_BLHU.shape[-1]),
                           jnp.float32)
  return (*f32, segment_ids_BL, state_BHKU.astype(jnp.float32))


def reference(q_BLHK: jax.Array, k_BLHK: jax.Array, v_BLHU: jax.Array,
              g_BLH: jax.Array, beta_BLH: jax.Array, *,
              segment_ids_BL: jax.Array | None = None,
              state_BHKU: jax.Array | None = None
              ) -> tuple[jax.Array, jax.Array]:
  """The rule token by token: (outputs [B, L, H, U], final state), float32.

  `state_BHKU` is the state before the first token (zeros when None; it
  belongs to the first token's segment)."""
  q, k, v, g, beta, segment_ids_BL, state_BHKU = _inputs(
      q_BLHK, k_BLHK, v_BLHU, g_BLH, beta_BLH, segment_ids_BL, state_BHKU)
  previous_BL = jnp.concatenate([segment_ids_BL[:, :1],
                                 segment_ids_BL[:, :-1]], axis=1)
  restart_BL = segment_ids_BL != previous_BL

  def body(state_BHKU, token):
    restart_B, q_BHK, k_BHK, v_BHU, g_BH, beta_BH = token
    state_BHKU = jnp.where(restart_B[:, None, None, None], 0.0, state_BHKU)
    o_BHU, state_BHKU = step(state_BHKU, q_BHK, k_BHK, v_BHU, g_BH, beta_BH)
    return state_BHKU, o_BHU

  tokens = [jnp.moveaxis(x, 1, 0) for x in (restart_BL, q, k, v, g, beta)]
  state_BHKU, o_LBHU = jax.lax.scan(body, state_BHKU, tokens)
  return jnp.moveaxis(o_LBHU, 0, 1), state_BHKU


def chunked(q_BLHK: jax.Array, k_BLHK: jax.Array, v_BLHU: jax.Array,
            g_BLH: jax.Array, beta_BLH: jax.Array, *, chunk: int,
            segment_ids_BL: jax.Array | None = None,
            state_BHKU: jax.Array | None = None
            ) -> tuple[jax.Array, jax.Array]:
  """`reference` in chunks of `chunk` tokens (module docstring).

  Within a chunk (i, j its positions, G the cumulative log-decay from the
  chunk's start, m_i whether token i continues the segment of the state
  the chunk starts from), the written values u solve
    u_i + sum_{j<i} beta_i exp(G_i - G_j) (k_i . k_j) u_j
        = beta_i (v_i - m_i exp(G_i) S^T k_i),
  the outputs are o_i = m_i exp(G_i) S^T q_i
    + sum_{j<=i} exp(G_i - G_j) (q_i . k_j) u_j,
  and the state passed on is m_C exp(G_C) S + sum_j exp(G_C - G_j) k_j u_j^T
  (terms only within one segment)."""
  q, k, v, g, beta, segment_ids_BL, state_BHKU = _inputs(
      q_BLHK, k_BLHK, v_BLHU, g_BLH, beta_BLH, segment_ids_BL, state_BHKU)
  batch, length, heads, _ = q.shape
  pad = -length % chunk
  if pad:  # Inert tokens of the last token's segment.
    def padded(x):
      return jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    q, k, v, g, beta = map(padded, (q, k, v, g, beta))
    segment_ids_BL = jnp.pad(segment_ids_BL, [(0, 0), (0, pad)], mode="edge")
  count = (length + pad) // chunk

  def chunks(x):  # [B, L, ...] -> [B, j, i, ...]
    return x.reshape(batch, count, chunk, *x.shape[2:])

  q, k, v, g, beta, seg_Bji = map(chunks, (q, k, v, g, beta, segment_ids_BL))
  # The segment of the state each chunk starts from: the previous token's.
  before_Bj = jnp.concatenate([seg_Bji[:, :1, 0], seg_Bji[:, :-1, -1]],
                              axis=1)
  continues_Bji = seg_Bji == before_Bj[:, :, None]
  cum_BjiH = jnp.cumsum(g, axis=2)
  same_Bjii = seg_Bji[:, :, :, None] == seg_Bji[:, :, None, :]
  lower = jnp.tril(jnp.ones((chunk, chunk), bool))
  strict = jnp.tril(jnp.ones((chunk, chunk), bool), -1)

  def decay(mask_Bjii):  # exp(G_i - G_j) where mask, else 0: [B, j, H, i, i]
    diff_BjHii = (jnp.moveaxis(cum_BjiH, -1, 2)[..., :, None] -
                  jnp.moveaxis(cum_BjiH, -1, 2)[..., None, :])
    mask_Bj1ii = mask_Bjii[:, :, None]
    return jnp.where(mask_Bj1ii, jnp.exp(jnp.where(mask_Bj1ii, diff_BjHii,
                                                   -jnp.inf)), 0.0)

  a_BjHii = (beta.swapaxes(2, 3)[..., :, None] * decay(same_Bjii & strict) *
             jnp.einsum("bjihk,bjlhk->bjhil", k, k))
  start_BjiH = jnp.exp(cum_BjiH) * continues_Bji[..., None]
  rhs_BjHix = jnp.concatenate([
      jnp.moveaxis(v * beta[..., None], 3, 2),
      jnp.moveaxis(k * (beta * start_BjiH)[..., None], 3, 2)], axis=-1)
  # (I + A) X = rhs, A strictly lower.
  solved_BjHix = unit_lower_inverse(a_BjHii) @ rhs_BjHix
  values = v.shape[-1]
  u_BjHiU, w_BjHiK = solved_BjHix[..., :values], solved_BjHix[..., values:]
  scores_BjHii = (jnp.einsum("bjihk,bjlhk->bjhil", q, k) *
                  decay(same_Bjii & lower))
  q_start_BjHiK = jnp.moveaxis(q * start_BjiH[..., None], 3, 2)
  last_BjiH = jnp.exp(cum_BjiH[:, :, -1:] - cum_BjiH) * (
      seg_Bji == seg_Bji[:, :, -1:])[..., None]
  k_last_BjHiK = jnp.moveaxis(k * last_BjiH[..., None], 3, 2)
  carry_BjH = jnp.exp(cum_BjiH[:, :, -1]) * continues_Bji[:, :, -1:]

  def body(state_BHKU, per_chunk):
    u_BHiU, w_BHiK, scores_BHii, q_start_BHiK, k_last_BHiK, carry_BH = (
        per_chunk)
    written_BHiU = u_BHiU - jnp.einsum("bhik,bhku->bhiu", w_BHiK, state_BHKU)
    o_BHiU = (jnp.einsum("bhik,bhku->bhiu", q_start_BHiK, state_BHKU) +
              jnp.einsum("bhil,bhlu->bhiu", scores_BHii, written_BHiU))
    state_BHKU = (state_BHKU * carry_BH[..., None, None] +
                  jnp.einsum("bhik,bhiu->bhku", k_last_BHiK, written_BHiU))
    return state_BHKU, o_BHiU

  per_chunk = [jnp.moveaxis(x, 1, 0) for x in (
      u_BjHiU, w_BjHiK, scores_BjHii, q_start_BjHiK, k_last_BjHiK,
      carry_BjH)]
  state_BHKU, o_jBHiU = jax.lax.scan(body, state_BHKU, per_chunk)
  o_BLHU = jnp.moveaxis(o_jBHiU, 0, 1).swapaxes(2, 3).reshape(
      batch, count * chunk, heads, values)
  return o_BLHU[:, :length], state_BHKU
