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

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
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


def _logits2(st, q_qK, k_sK):
  """Scaled, soft-capped logits [q, s] in base 2 (times log2(e)), float32,
  and the soft-cap's tanh (None when off)."""
  s_qs = plgpu.dot(q_qK, k_sK, trans_b=True) * st.scale
  if not st.logit_softcap:
    return s_qs * _LOG2E, None
  tanh_qs = jnp.tanh(s_qs / st.logit_softcap)
  return tanh_qs * (st.logit_softcap * _LOG2E), tanh_qs


def _tile_mask(st, q_first, k_first, block_q, block_kv, seg_q_q, seg_k_s):
  """Boolean [q, s]: causal, within the window, same segment."""
  q_q1 = q_first + jnp.arange(block_q)[:, None]
  k_1s = k_first + jnp.arange(block_kv)[None, :]
  mask_qs = k_1s <= q_q1
  if st.window is not None:
    mask_qs &= q_q1 - k_1s < st.window
  if seg_q_q is not None:
    mask_qs &= seg_q_q[:, None] == seg_k_s[None, :]
  return mask_qs


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
  q_qK = q_ref[...]
  seg_q_q = _segments(seg_ref, q_first, block_q)
  zeros_q = jnp.zeros((block_q,), jnp.float32)
  if sinks_ref is None:
    m_q, l_q = zeros_q + _HIDDEN, zeros_q
  else:
    m_q, l_q = zeros_q + sinks_ref[...] * _LOG2E, zeros_q + 1.0
  acc_qK = jnp.zeros((block_q, v_ref.shape[-1]), jnp.float32)

  def key_block(kj, carry):
    m_q, l_q, acc_qK = carry
    k_first = kj * block_kv
    keys = pl.ds(k_first, block_kv)
    s_qs, _ = _logits2(st, q_qK, k_ref[keys, :])
    mask_qs = _tile_mask(st, q_first, k_first, block_q, block_kv, seg_q_q,
                         _segments(seg_ref, k_first, block_kv))
    s_qs = jnp.where(mask_qs, s_qs, _HIDDEN)
    m_new_q = jnp.maximum(m_q, s_qs.max(-1))
    # While a row has seen only hidden keys (m = _HIDDEN) their p is 1, but
    # alpha = 0 wipes that out once the row's first visible key (every row
    # sees its own position) raises the max.
    p_qs = jnp.exp2(s_qs - m_new_q[:, None])
    alpha_q = jnp.exp2(m_q - m_new_q)
    v_sK = v_ref[keys, :]
    acc_qK = acc_qK * alpha_q[:, None] + plgpu.dot(
        p_qs.astype(v_sK.dtype), v_sK)
    return m_new_q, l_q * alpha_q + p_qs.sum(-1), acc_qK

  first, end = _key_blocks(st, q_first, block_q, block_kv)
  m_q, l_q, acc_qK = lax.fori_loop(first, end, key_block, (m_q, l_q, acc_qK))
  o_ref[...] = (acc_qK / l_q[:, None]).astype(o_ref.dtype)
  lse_ref[...] = (m_q + jnp.log2(l_q)) / _LOG2E


def _probs_and_dlogits(st, q_qK, k_sK, v_sK, do_qK, lse_q, delta_q, mask_qs):
  """A tile's probabilities P [q, s] and the gradient of the loss with
  respect to its raw scaled logits (soft-cap derivative and scale
  included), both float32."""
  s_qs, tanh_qs = _logits2(st, q_qK, k_sK)
  p_qs = jnp.where(mask_qs, jnp.exp2(s_qs - lse_q[:, None] * _LOG2E), 0.0)
  dp_qs = plgpu.dot(do_qK, v_sK, trans_b=True)
  ds_qs = p_qs * (dp_qs - delta_q[:, None])
  if tanh_qs is not None:
    ds_qs *= 1.0 - tanh_qs * tanh_qs
  return p_qs, ds_qs * st.scale


def dq_kernel(q_ref, k_ref, v_ref, seg_ref, do_ref, lse_ref, delta_ref,
              dq_ref, *, st):
  """One (query tile, batch row, query head): dQ over the visible keys."""
  block_q, block_kv = st.backward_block_q, st.backward_block_kv
  q_first = pl.program_id(0) * block_q
  q_qK, do_qK = q_ref[...], do_ref[...]
  lse_q, delta_q = lse_ref[...], delta_ref[...]
  seg_q_q = _segments(seg_ref, q_first, block_q)

  def key_block(kj, dq_qK):
    k_first = kj * block_kv
    keys = pl.ds(k_first, block_kv)
    k_sK = k_ref[keys, :]
    mask_qs = _tile_mask(st, q_first, k_first, block_q, block_kv, seg_q_q,
                         _segments(seg_ref, k_first, block_kv))
    _, ds_qs = _probs_and_dlogits(st, q_qK, k_sK, v_ref[keys, :], do_qK,
                                  lse_q, delta_q, mask_qs)
    return dq_qK + plgpu.dot(ds_qs.astype(k_sK.dtype), k_sK)

  first, end = _key_blocks(st, q_first, block_q, block_kv)
  dq_qK = lax.fori_loop(first, end, key_block,
                        jnp.zeros(q_qK.shape, jnp.float32))
  dq_ref[...] = dq_qK.astype(dq_ref.dtype)


def dkv_kernel(q_ref, k_ref, v_ref, seg_ref, do_ref, lse_ref, delta_ref,
               dk_ref, dv_ref, *, st, group):
  """One (key tile, batch row, key/value head): dK and dV summed over the
  `group` query heads that share the key/value head."""
  block_q, block_kv = st.backward_block_q, st.backward_block_kv
  k_first = pl.program_id(0) * block_kv
  k_sK, v_sK = k_ref[...], v_ref[...]
  seg_k_s = _segments(seg_ref, k_first, block_kv)
  num_q_blocks = q_ref.shape[0] // block_q
  first, end = _query_blocks(st, k_first, block_q, block_kv, num_q_blocks)

  def query_head(r, carry):

    def query_block(qi, carry):
      dk_sK, dv_sK = carry
      q_first = qi * block_q
      queries = pl.ds(q_first, block_q)
      q_qK, do_qK = q_ref[queries, r, :], do_ref[queries, r, :]
      mask_qs = _tile_mask(st, q_first, k_first, block_q, block_kv,
                           _segments(seg_ref, q_first, block_q), seg_k_s)
      p_qs, ds_qs = _probs_and_dlogits(st, q_qK, k_sK, v_sK, do_qK,
                                       lse_ref[r, queries],
                                       delta_ref[r, queries], mask_qs)
      dv_sK += plgpu.dot(p_qs.astype(do_qK.dtype), do_qK, trans_a=True)
      dk_sK += plgpu.dot(ds_qs.astype(q_qK.dtype), q_qK, trans_a=True)
      return dk_sK, dv_sK

    return lax.fori_loop(first, end, query_block, carry)

  dk_sK, dv_sK = lax.fori_loop(
      0, group, query_head, (jnp.zeros(k_sK.shape, jnp.float32),
                             jnp.zeros(v_sK.shape, jnp.float32)))
  dk_ref[...] = dk_sK.astype(dk_ref.dtype)
  dv_ref[...] = dv_sK.astype(dv_ref.dtype)
