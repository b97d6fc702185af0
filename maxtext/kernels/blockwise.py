"""Memory-efficient (flash-style) causal attention in plain JAX.

Same function and arguments as `attention.reference_attention`, computed one
(query block, key block) tile at a time with an online softmax: a `lax.scan`
over query blocks, inside it a `lax.scan` over key blocks, carrying the
running max, denominator and float32 output accumulator. Tiles that the
causal mask or the window hide completely are skipped (`lax.cond`). A
`jax.custom_vjp` saves only the output and the per-row log-sum-exp; the
backward pass recomputes each tile's probabilities, so neither pass holds an
L x S matrix: memory is O(L) plus one tile. GQA is computed by grouping the
R = H // G query heads of each key/value head, never repeating K/V.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import functools
from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

from maxtext.kernels import attention

# Logit of a hidden key: finite, so that `max` and `exp` stay NaN-free.
_HIDDEN = -1e30


class _Static(NamedTuple):
  """Hashable non-array arguments of the custom-vjp function."""
  scale: float
  window: int | None
  logit_softcap: float
  block_q: int
  block_kv: int
  length: int  # Unpadded L.
  kv_length: int  # Unpadded S.


def pad_to(x, axis, multiple, value=0):
  pad = -x.shape[axis] % multiple
  if not pad:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths, constant_values=value)


def split_blocks(x, axis, block):
  """Splits `axis` into (N, block) and moves N to the front."""
  shape = x.shape[:axis] + (x.shape[axis] // block, block) + x.shape[axis + 1:]
  return jnp.moveaxis(x.reshape(shape), axis, 0)


def tile_mask(st, q_first, k_first, keys_left, seg_q_Bq, seg_k_Bs,
              mask_Bqs=None):
  """Boolean [B or 1, Q, T]: which (query, key) pairs of a tile attend.

  The tile's first query and first key sit at positions `q_first` and
  `k_first`; keys past its first `keys_left` are padding. `st` has the
  fields window, block_q and block_kv. An explicit `mask_Bqs`
  replaces the causal, window and segment masks.
  """
  q_q1 = q_first + jnp.arange(st.block_q)[:, None]
  t_1s = jnp.arange(st.block_kv)[None, :]
  k_1s = k_first + t_1s
  valid_qs = t_1s < keys_left
  if mask_Bqs is not None:
    return mask_Bqs & valid_qs[None]
  valid_qs &= k_1s <= q_q1
  if st.window is not None:
    valid_qs &= q_q1 - k_1s < st.window
  mask_Bqs = valid_qs[None]
  if seg_q_Bq is not None:
    mask_Bqs &= seg_q_Bq[:, :, None] == seg_k_Bs[:, None, :]
  return mask_Bqs


def tile_needed(st, q_first, k_first):
  """False when the causal mask or the window hides every pair of the tile
  whose first query and first key sit at positions `q_first` and
  `k_first`."""
  needed = k_first <= q_first + st.block_q - 1
  if st.window is not None:
    needed &= q_first - (k_first + st.block_kv - 1) < st.window
  return needed


def _tile(st, qi, kj, seg_q_Bq, seg_k_Bs, mask_Bqs):
  """Tile (qi, kj)'s mask [B, 1, 1, q, s] and whether it needs computing."""
  q_first, k_first = qi * st.block_q, kj * st.block_kv
  mask_B11qs = tile_mask(st, q_first, k_first, st.kv_length - k_first,
                         seg_q_Bq, seg_k_Bs, mask_Bqs)[:, None, None]
  if mask_Bqs is not None:
    return mask_B11qs, jnp.bool_(True)
  return mask_B11qs, tile_needed(st, q_first, k_first)


def tile_logits(st, q_BqGRK, k_BsGK):
  """Scaled (and soft-capped) float32 logits [B, G, R, q, s], and tanh."""
  raw = jnp.einsum("bqgrk,btgk->bgrqt", q_BqGRK, k_BsGK,
                   preferred_element_type=jnp.float32) * st.scale
  if not st.logit_softcap:
    return raw, None
  tanh = jnp.tanh(raw / st.logit_softcap)
  return st.logit_softcap * tanh, tanh


def tile_backward(st, q_BqGRK, k_BsGK, v_BsGK, do_BqGRK, lse_BGRq,
                  delta_BGRq, mask_B11qs, dk_BsGK, dv_BsGK):
  """One tile's gradients: (dq [B, q, G, R, K], dk_BsGK + the tile's dk,
  dv_BsGK + the tile's dv), all float32.

  Recomputes the tile's probabilities from the log-sum-exp `lse_BGRq`;
  `delta_BGRq` is rowsum(dO * O).
  """
  s_BGRqs, tanh_BGRqs = tile_logits(st, q_BqGRK, k_BsGK)
  p_BGRqs = jnp.where(mask_B11qs, jnp.exp(s_BGRqs - lse_BGRq[..., None]),
                      0.0)
  dv_BsGK += jnp.einsum("bgrqt,bqgrk->btgk", p_BGRqs.astype(do_BqGRK.dtype),
                        do_BqGRK, preferred_element_type=jnp.float32)
  dp_BGRqs = jnp.einsum("bqgrk,btgk->bgrqt", do_BqGRK, v_BsGK,
                        preferred_element_type=jnp.float32)
  ds_BGRqs = p_BGRqs * (dp_BGRqs - delta_BGRq[..., None])
  if tanh_BGRqs is not None:
    ds_BGRqs *= 1.0 - tanh_BGRqs ** 2
  ds_BGRqs *= st.scale
  dq_BqGRK = jnp.einsum("bgrqt,btgk->bqgrk", ds_BGRqs,
                        k_BsGK.astype(jnp.float32))
  dk_BsGK += jnp.einsum("bgrqt,bqgrk->btgk", ds_BGRqs,
                        q_BqGRK.astype(jnp.float32))
  return dq_BqGRK, dk_BsGK, dv_BsGK


def _split(st, q_BLHK, k_BSGK, v_BSGK, segment_ids_BL, mask_BLS):
  """Pads and splits the inputs into blocks along L and S."""
  batch, _, num_heads, head_dim = q_BLHK.shape
  num_kv_heads = k_BSGK.shape[2]
  q_BLGRK = pad_to(q_BLHK, 1, st.block_q).reshape(
      batch, -1, num_kv_heads, num_heads // num_kv_heads, head_dim)
  q_mBqGRK = split_blocks(q_BLGRK, 1, st.block_q)
  k_nBsGK = split_blocks(pad_to(k_BSGK, 1, st.block_kv), 1, st.block_kv)
  v_nBsGK = split_blocks(pad_to(v_BSGK, 1, st.block_kv), 1, st.block_kv)
  seg_q_mBq = seg_k_nBs = mask_mnBqs = None
  if segment_ids_BL is not None:
    seg_q_mBq = split_blocks(pad_to(segment_ids_BL, 1, st.block_q), 1,
                             st.block_q)
    seg_k_nBs = split_blocks(pad_to(segment_ids_BL, 1, st.block_kv), 1,
                             st.block_kv)
  if mask_BLS is not None:
    mask_BLS = pad_to(pad_to(mask_BLS, 1, st.block_q, False), 2,
                       st.block_kv, False)
    mask_mBqS = split_blocks(mask_BLS, 1, st.block_q)
    mask_mnBqs = jnp.moveaxis(split_blocks(mask_mBqS, 3, st.block_kv), 0, 1)
  return q_mBqGRK, k_nBsGK, v_nBsGK, seg_q_mBq, seg_k_nBs, mask_mnBqs


def online_softmax_init(stat_shape, value_dim, sinks_H=None):
  """Running max, denominator and float32 output of an online softmax over
  rows `stat_shape` = [B, G, R, q]; the sinks (H = G * R) start them."""
  if sinks_H is None:
    m_BGRq = jnp.full(stat_shape, _HIDDEN, jnp.float32)
    l_BGRq = jnp.zeros(stat_shape, jnp.float32)
  else:
    sinks_GR1 = sinks_H.astype(jnp.float32).reshape(*stat_shape[1:3], 1)
    m_BGRq = jnp.broadcast_to(sinks_GR1, stat_shape)
    l_BGRq = jnp.ones(stat_shape, jnp.float32)
  return m_BGRq, l_BGRq, jnp.zeros((*stat_shape, value_dim), jnp.float32)


def online_softmax_update(carry, s_BGRqs, mask_B11qs, v_BsGK):
  """Folds one block of keys (logits `s_BGRqs`, visible where
  `mask_B11qs`, values `v_BsGK`) into the running softmax `carry`."""
  m_BGRq, l_BGRq, acc_BGRqK = carry
  s_BGRqs = jnp.where(mask_B11qs, s_BGRqs, _HIDDEN)
  m_new = jnp.maximum(m_BGRq, s_BGRqs.max(-1))
  p_BGRqs = jnp.where(mask_B11qs, jnp.exp(s_BGRqs - m_new[..., None]), 0.0)
  alpha_BGRq = jnp.exp(m_BGRq - m_new)
  pv_BGRqK = jnp.einsum("bgrqt,btgk->bgrqk", p_BGRqs.astype(v_BsGK.dtype),
                        v_BsGK, preferred_element_type=jnp.float32)
  return (m_new, l_BGRq * alpha_BGRq + p_BGRqs.sum(-1),
          acc_BGRqK * alpha_BGRq[..., None] + pv_BGRqK)


def online_softmax_finish(carry):
  """Output [B, G, R, q, K] (float32) and log-sum-exp [B, G, R, q]."""
  m_BGRq, l_BGRq, acc_BGRqK = carry
  nonempty = l_BGRq > 0
  o_BGRqK = acc_BGRqK / jnp.where(nonempty, l_BGRq, 1.0)[..., None]
  # Rows with no visible key (padding only) get +inf: probabilities 0.
  lse_BGRq = jnp.where(nonempty, m_BGRq + jnp.log(l_BGRq), jnp.inf)
  return o_BGRqK, lse_BGRq


def _forward(st, q_BLHK, k_BSGK, v_BSGK, sinks_H, segment_ids_BL, mask_BLS):
  """Output [B, L, H, K] and log-sum-exp [m, B, G, R, q] (sinks included)."""
  batch, length, num_heads, _ = q_BLHK.shape
  value_dim = v_BSGK.shape[-1]
  q_mBqGRK, k_nBsGK, v_nBsGK, seg_q_mBq, seg_k_nBs, mask_mnBqs = _split(
      st, q_BLHK, k_BSGK, v_BSGK, segment_ids_BL, mask_BLS)
  _, _, _, num_kv_heads, group, _ = q_mBqGRK.shape
  init = online_softmax_init((batch, num_kv_heads, group, st.block_q),
                             value_dim, sinks_H)

  def query_block(_, xs):
    qi, q_BqGRK, seg_q_Bq, mask_nBqs = xs

    def key_block(carry, ys):
      kj, k_BsGK, v_BsGK, seg_k_Bs, mask_Bqs = ys

      mask_B11qs, needed = _tile(st, qi, kj, seg_q_Bq, seg_k_Bs, mask_Bqs)

      def update(carry):
        s_BGRqs, _ = tile_logits(st, q_BqGRK, k_BsGK)
        return online_softmax_update(carry, s_BGRqs, mask_B11qs, v_BsGK)

      return lax.cond(needed, update, lambda c: c, carry), None

    carry, _ = lax.scan(
        key_block, init,
        (jnp.arange(k_nBsGK.shape[0]), k_nBsGK, v_nBsGK, seg_k_nBs,
         mask_nBqs))
    o_BGRqK, lse_BGRq = online_softmax_finish(carry)
    return None, (o_BGRqK.astype(v_BSGK.dtype), lse_BGRq)

  _, (o_mBGRqK, lse_mBGRq) = lax.scan(
      query_block, None,
      (jnp.arange(q_mBqGRK.shape[0]), q_mBqGRK, seg_q_mBq, mask_mnBqs))
  o_BLHK = o_mBGRqK.transpose(1, 0, 4, 2, 3, 5).reshape(
      batch, -1, num_heads, value_dim)[:, :length]
  return o_BLHK, lse_mBGRq


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _blockwise(st, q_BLHK, k_BSGK, v_BSGK, sinks_H, segment_ids_BL,
               mask_BLS):
  return _forward(st, q_BLHK, k_BSGK, v_BSGK, sinks_H, segment_ids_BL,
                  mask_BLS)[0]


def _blockwise_fwd(st, q_BLHK, k_BSGK, v_BSGK, sinks_H, segment_ids_BL,
                   mask_BLS):
  o_BLHK, lse_mBGRq = _forward(st, q_BLHK, k_BSGK, v_BSGK, sinks_H,
                               segment_ids_BL, mask_BLS)
  residuals = (q_BLHK, k_BSGK, v_BSGK, sinks_H, segment_ids_BL, mask_BLS,
               o_BLHK, lse_mBGRq)
  return o_BLHK, residuals


def _blockwise_bwd(st, residuals, do_BLHK):
  (q_BLHK, k_BSGK, v_BSGK, sinks_H, segment_ids_BL, mask_BLS, o_BLHK,
   lse_mBGRq) = residuals
  batch, length, num_heads, _ = q_BLHK.shape
  kv_length, num_kv_heads = k_BSGK.shape[1:3]
  group = num_heads // num_kv_heads
  q_mBqGRK, k_nBsGK, v_nBsGK, seg_q_mBq, seg_k_nBs, mask_mnBqs = _split(
      st, q_BLHK, k_BSGK, v_BSGK, segment_ids_BL, mask_BLS)
  do_mBqGRK = split_blocks(
      pad_to(do_BLHK, 1, st.block_q).reshape(batch, -1, num_kv_heads, group,
                                              do_BLHK.shape[-1]), 1,
      st.block_q)
  # D = rowsum(dO * O): the softmax backward's per-row correction.
  delta_BLH = jnp.einsum("blhk,blhk->blh", do_BLHK.astype(jnp.float32),
                         o_BLHK.astype(jnp.float32))
  delta_mBGRq = jnp.moveaxis(
      split_blocks(pad_to(delta_BLH, 1, st.block_q), 1, st.block_q).reshape(
          -1, batch, st.block_q, num_kv_heads, group), 2, 4)
  mask_mnBqs = None if mask_mnBqs is None else jnp.moveaxis(mask_mnBqs, 0, 1)

  def key_block(dq_mBqGRK, xs):
    kj, k_BsGK, v_BsGK, seg_k_Bs, mask_nBqs = xs

    def query_block(carry, ys):
      qi, q_BqGRK, do_BqGRK, lse_BGRq, delta_BGRq, seg_q_Bq, mask_Bqs = ys

      mask_B11qs, needed = _tile(st, qi, kj, seg_q_Bq, seg_k_Bs, mask_Bqs)

      def update(carry):
        dq_mBqGRK, dk_BsGK, dv_BsGK = carry
        dq_BqGRK, dk_BsGK, dv_BsGK = tile_backward(
            st, q_BqGRK, k_BsGK, v_BsGK, do_BqGRK, lse_BGRq, delta_BGRq,
            mask_B11qs, dk_BsGK, dv_BsGK)
        return dq_mBqGRK.at[qi].add(dq_BqGRK), dk_BsGK, dv_BsGK

      return lax.cond(needed, update, lambda c: c, carry), None

    (dq_mBqGRK, dk_BsGK, dv_BsGK), _ = lax.scan(
        query_block, (dq_mBqGRK, jnp.zeros(k_BsGK.shape, jnp.float32),
                      jnp.zeros(v_BsGK.shape, jnp.float32)),
        (jnp.arange(q_mBqGRK.shape[0]), q_mBqGRK, do_mBqGRK, lse_mBGRq,
         delta_mBGRq, seg_q_mBq, mask_nBqs))
    return dq_mBqGRK, (dk_BsGK, dv_BsGK)

  dq_mBqGRK, (dk_nBsGK, dv_nBsGK) = lax.scan(
      key_block, jnp.zeros(q_mBqGRK.shape, jnp.float32),
      (jnp.arange(k_nBsGK.shape[0]), k_nBsGK, v_nBsGK, seg_k_nBs,
       mask_mnBqs))

  def unblock(x_NB_K, heads, size):
    return jnp.moveaxis(x_NB_K, 0, 1).reshape(batch, -1, heads,
                                              x_NB_K.shape[-1])[:, :size]

  dq_BLHK = unblock(dq_mBqGRK, num_heads, length).astype(q_BLHK.dtype)
  dk_BSGK = unblock(dk_nBsGK, num_kv_heads, kv_length).astype(k_BSGK.dtype)
  dv_BSGK = unblock(dv_nBsGK, num_kv_heads, kv_length).astype(v_BSGK.dtype)
  dsinks_H = None
  if sinks_H is not None:
    # The sink is a key with value 0: d sink = -sum_rows p_sink * D.
    sinks_1GR1 = sinks_H.astype(jnp.float32).reshape(1, num_kv_heads, group,
                                                     1)
    p_sink_mBGRq = jnp.exp(sinks_1GR1 - lse_mBGRq)
    dsinks_H = -(p_sink_mBGRq * delta_mBGRq).sum((0, 1, 4)).reshape(
        num_heads).astype(sinks_H.dtype)
  return dq_BLHK, dk_BSGK, dv_BSGK, dsinks_H, None, None


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def blockwise_attention(
    q_BLHK: jax.Array,
    k_BSGK: jax.Array,
    v_BSGK: jax.Array,
    *,
    scale: float,
    window: int | None = None,
    segment_ids_BL: jax.Array | None = None,
    logit_softcap: float = 0.0,
    sinks_H: jax.Array | None = None,
    mask_BLS: jax.Array | None = None,
    block_q: int = 512,
    block_kv: int = 512,
) -> jax.Array:
  """Flash-style attention; arguments as `attention.reference_attention`.

  Args:
    q_BLHK: Queries.
    k_BSGK: Keys.
    v_BSGK: Values.
    scale: Multiplier of the query-key dot products.
    window: A query sees this many keys, itself included; None: no window.
    segment_ids_BL: Tokens attend only to tokens with the same id.
    logit_softcap: Logits become `c * tanh(logits / c)`; 0 is off.
    sinks_H: Per-query-head sink logit (scaled-logit units) that joins the
      softmax denominator with a zero value; None: no sinks.
    mask_BLS: Explicit mask replacing the causal, window and segment masks.
    block_q: Queries per tile (capped at L).
    block_kv: Keys per tile (capped at S).

  Returns:
    Attention output [B, L, H, K] in the dtype of `v_BSGK`.

  Raises:
    ValueError: a block size is not positive, or `mask_BLS` is combined with
      a window or segment ids.
  """
  attention.check_mask_args(
      mask_BLS, window, segment_ids_BL)
  for name, value in (("block_q", block_q), ("block_kv", block_kv)):
    if value < 1:
      raise ValueError(f"blockwise_attention: {name}={value} must be a "
                       "positive integer.")
  length, kv_length = q_BLHK.shape[1], k_BSGK.shape[1]
  st = _Static(scale=float(scale), window=window,
               logit_softcap=float(logit_softcap),
               block_q=min(block_q, length), block_kv=min(block_kv, kv_length),
               length=length, kv_length=kv_length)
  return _blockwise(st, q_BLHK, k_BSGK, v_BSGK, sinks_H, segment_ids_BL,
                    mask_BLS)
