"""The Pallas kernel bodies of the GPU flash attention (Triton).

One program of each of the three `pl.pallas_call`s of
`maxtext.kernels.pallas_gpu`, which pads the inputs, lays out the grids and
tiles and ties the kernels together with a custom VJP; `st` is that
module's `_Static` (scale, window, soft-cap, tiles, interpret).

  forward  grid (query block, B, H): one query tile stays in registers while
           a `lax.fori_loop` walks the key tiles with an online softmax
           (running max, denominator, float32 accumulator), in base 2
           (`exp2`, log2(e) folded into the logits). A sink starts the row's
           max and denominator. Writes the output and the per-row
           log-sum-exp (natural units, sinks included).
  dq       grid (query block, B, H): the same walk, recomputing each tile's
           probabilities from the log-sum-exp; dS = P (dP - D) with
           D = rowsum(dO O), times the soft-cap derivative 1 - tanh^2.
  dk, dv   grid (key block, B, G): for each of the R = H // G query heads of
           the key/value head, a walk over the query tiles accumulating
           dV += P^T dO and dK += dS^T Q, so GQA never repeats K/V and dK/dV
           need no reduction over heads afterwards.

Each walk covers only the tiles the causal mask and the window leave visible:
the loop bounds are computed from the program id (dynamic `fori_loop`
bounds, as in jax's kernel). Segment ids mask inside the tiles.

Shape key: B batch, H query heads, G key/value heads, R = H // G, K head
dim; Q query tile, T key tile.
"""

import math

from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
import jax.numpy as jnp

_LOG2E = math.log2(math.e)
# Base-2 logit of a hidden key: finite, so that `max` and `exp2` stay
# NaN-free.
_HIDDEN = -1e30


def _logits2(st, q_QK, k_TK):
  """Scaled, soft-capped logits [Q, T] in base 2 (times log2(e)), float32,
  and the soft-cap's tanh (None when off)."""
  s_QT = plgpu.dot(q_QK, k_TK, trans_b=True) * st.scale
  if not st.logit_softcap:
    return s_QT * _LOG2E, None
  tanh_QT = jnp.tanh(s_QT / st.logit_softcap)
  return tanh_QT * (st.logit_softcap * _LOG2E), tanh_QT


def _tile_mask(st, q_first, k_first, block_q, block_kv, seg_q_Q, seg_k_T):
  """Boolean [Q, T]: causal, within the window, same segment."""
  q_Q1 = q_first + jnp.arange(block_q)[:, None]
  k_1T = k_first + jnp.arange(block_kv)[None, :]
  mask_QT = k_1T <= q_Q1
  if st.window is not None:
    mask_QT &= q_Q1 - k_1T < st.window
  if seg_q_Q is not None:
    mask_QT &= seg_q_Q[:, None] == seg_k_T[None, :]
  return mask_QT


def _key_blocks(st, q_first, block_q, block_kv):
  """[first, end) of the key tiles that queries q_first .. q_first +
  block_q - 1 see under the causal mask and the window."""
  end = lax.div(q_first + block_q + block_kv - 1, block_kv)
  if st.window is None:
    return 0, end
  return lax.div(jnp.maximum(q_first - st.window + 1, 0), block_kv), end


def _query_blocks(st, k_first, block_q, block_kv, num_q_blocks):
  """[first, end) of the query tiles that see keys k_first .. k_first +
  block_kv - 1 under the causal mask and the window."""
  first = lax.div(k_first, block_q)
  if st.window is None:
    return first, num_q_blocks
  last_query = k_first + block_kv - 1 + st.window - 1
  return first, jnp.minimum(lax.div(last_query, block_q) + 1, num_q_blocks)


def _segments(seg_ref, start, size):
  return None if seg_ref is None else seg_ref[pl.ds(start, size)]


def forward_kernel(q_ref, k_ref, v_ref, seg_ref, sinks_ref, o_ref, lse_ref,
                   *, st):
  """One (query tile, batch row, query head): output and log-sum-exp."""
  block_q, block_kv = st.block_q, st.block_kv
  q_first = pl.program_id(0) * block_q
  q_QK = q_ref[...]
  seg_q_Q = _segments(seg_ref, q_first, block_q)
  zeros_Q = jnp.zeros((block_q,), jnp.float32)
  if sinks_ref is None:
    m_Q, l_Q = zeros_Q + _HIDDEN, zeros_Q
  else:
    m_Q, l_Q = zeros_Q + sinks_ref[...] * _LOG2E, zeros_Q + 1.0
  acc_QK = jnp.zeros((block_q, v_ref.shape[-1]), jnp.float32)

  def key_block(kj, carry):
    m_Q, l_Q, acc_QK = carry
    k_first = kj * block_kv
    keys = pl.ds(k_first, block_kv)
    s_QT, _ = _logits2(st, q_QK, k_ref[keys, :])
    mask_QT = _tile_mask(st, q_first, k_first, block_q, block_kv, seg_q_Q,
                         _segments(seg_ref, k_first, block_kv))
    s_QT = jnp.where(mask_QT, s_QT, _HIDDEN)
    m_new_Q = jnp.maximum(m_Q, s_QT.max(-1))
    # While a row has seen only hidden keys (m = _HIDDEN) their p is 1, but
    # alpha = 0 wipes that out once the row's first visible key (every row
    # sees its own position) raises the max.
    p_QT = jnp.exp2(s_QT - m_new_Q[:, None])
    alpha_Q = jnp.exp2(m_Q - m_new_Q)
    v_TK = v_ref[keys, :]
    acc_QK = acc_QK * alpha_Q[:, None] + plgpu.dot(
        p_QT.astype(v_TK.dtype), v_TK)
    return m_new_Q, l_Q * alpha_Q + p_QT.sum(-1), acc_QK

  first, end = _key_blocks(st, q_first, block_q, block_kv)
  m_Q, l_Q, acc_QK = lax.fori_loop(first, end, key_block, (m_Q, l_Q, acc_QK))
  o_ref[...] = (acc_QK / l_Q[:, None]).astype(o_ref.dtype)
  lse_ref[...] = (m_Q + jnp.log2(l_Q)) / _LOG2E


def _probs_and_dlogits(st, q_QK, k_TK, v_TK, do_QK, lse_Q, delta_Q, mask_QT):
  """A tile's probabilities P [Q, T] and the gradient of the loss with
  respect to its raw scaled logits (soft-cap derivative and scale
  included), both float32."""
  s_QT, tanh_QT = _logits2(st, q_QK, k_TK)
  p_QT = jnp.where(mask_QT, jnp.exp2(s_QT - lse_Q[:, None] * _LOG2E), 0.0)
  dp_QT = plgpu.dot(do_QK, v_TK, trans_b=True)
  ds_QT = p_QT * (dp_QT - delta_Q[:, None])
  if tanh_QT is not None:
    ds_QT *= 1.0 - tanh_QT * tanh_QT
  return p_QT, ds_QT * st.scale


def dq_kernel(q_ref, k_ref, v_ref, seg_ref, do_ref, lse_ref, delta_ref,
              dq_ref, *, st):
  """One (query tile, batch row, query head): dQ over the visible keys."""
  block_q, block_kv = st.backward_block_q, st.backward_block_kv
  q_first = pl.program_id(0) * block_q
  q_QK, do_QK = q_ref[...], do_ref[...]
  lse_Q, delta_Q = lse_ref[...], delta_ref[...]
  seg_q_Q = _segments(seg_ref, q_first, block_q)

  def key_block(kj, dq_QK):
    k_first = kj * block_kv
    keys = pl.ds(k_first, block_kv)
    k_TK = k_ref[keys, :]
    mask_QT = _tile_mask(st, q_first, k_first, block_q, block_kv, seg_q_Q,
                         _segments(seg_ref, k_first, block_kv))
    _, ds_QT = _probs_and_dlogits(st, q_QK, k_TK, v_ref[keys, :], do_QK,
                                  lse_Q, delta_Q, mask_QT)
    return dq_QK + plgpu.dot(ds_QT.astype(k_TK.dtype), k_TK)

  first, end = _key_blocks(st, q_first, block_q, block_kv)
  dq_QK = lax.fori_loop(first, end, key_block,
                        jnp.zeros(q_QK.shape, jnp.float32))
  dq_ref[...] = dq_QK.astype(dq_ref.dtype)


def dkv_kernel(q_ref, k_ref, v_ref, seg_ref, do_ref, lse_ref, delta_ref,
               dk_ref, dv_ref, *, st, group):
  """One (key tile, batch row, key/value head): dK and dV summed over the
  `group` query heads that share the key/value head."""
  block_q, block_kv = st.backward_block_q, st.backward_block_kv
  k_first = pl.program_id(0) * block_kv
  k_TK, v_TK = k_ref[...], v_ref[...]
  seg_k_T = _segments(seg_ref, k_first, block_kv)
  num_q_blocks = q_ref.shape[0] // block_q
  first, end = _query_blocks(st, k_first, block_q, block_kv, num_q_blocks)

  def query_head(r, carry):

    def query_block(qi, carry):
      dk_TK, dv_TK = carry
      q_first = qi * block_q
      queries = pl.ds(q_first, block_q)
      q_QK, do_QK = q_ref[queries, r, :], do_ref[queries, r, :]
      mask_QT = _tile_mask(st, q_first, k_first, block_q, block_kv,
                           _segments(seg_ref, q_first, block_q), seg_k_T)
      p_QT, ds_QT = _probs_and_dlogits(st, q_QK, k_TK, v_TK, do_QK,
                                       lse_ref[r, queries],
                                       delta_ref[r, queries], mask_QT)
      dv_TK += plgpu.dot(p_QT.astype(do_QK.dtype), do_QK, trans_a=True)
      dk_TK += plgpu.dot(ds_QT.astype(q_QK.dtype), q_QK, trans_a=True)
      return dk_TK, dv_TK

    return lax.fori_loop(first, end, query_block, carry)

  dk_TK, dv_TK = lax.fori_loop(
      0, group, query_head, (jnp.zeros(k_TK.shape, jnp.float32),
                             jnp.zeros(v_TK.shape, jnp.float32)))
  dk_ref[...] = dk_TK.astype(dk_ref.dtype)
  dv_ref[...] = dv_TK.astype(dv_ref.dtype)
