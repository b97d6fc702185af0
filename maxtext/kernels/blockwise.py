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

Shape key: B batch, L query length, S key length, H query heads, G key/value
heads, R = H // G, K head dim; N number of blocks, Q query block, T key block.
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


def tile_mask(st, q_first, k_first, keys_left, seg_q_BQ, seg_k_BT,
              mask_BQT=None):
  """Boolean [B or 1, Q, T]: which (query, key) pairs of a tile attend.

  The tile's first query and first key sit at positions `q_first` and
  `k_first`; keys past its first `keys_left` are padding. `st` has the
  fields window, block_q and block_kv. An explicit `mask_BQT`
  replaces the causal, window and segment masks.
  """
  q_Q1 = q_first + jnp.arange(st.block_q)[:, None]
  t_1T = jnp.arange(st.block_kv)[None, :]
  k_1T = k_first + t_1T
  valid_QT = t_1T < keys_left
  if mask_BQT is not None:
    return mask_BQT & valid_QT[None]
  valid_QT &= k_1T <= q_Q1
  if st.window is not None:
    valid_QT &= q_Q1 - k_1T < st.window
  mask_BQT = valid_QT[None]
  if seg_q_BQ is not None:
    mask_BQT &= seg_q_BQ[:, :, None] == seg_k_BT[:, None, :]
  return mask_BQT


def tile_needed(st, q_first, k_first):
  """False when the causal mask or the window hides every pair of the tile
  whose first query and first key sit at positions `q_first` and
  `k_first`."""
  needed = k_first <= q_first + st.block_q - 1
  if st.window is not None:
    needed &= q_first - (k_first + st.block_kv - 1) < st.window
  return needed


def _tile(st, qi, kj, seg_q_BQ, seg_k_BT, mask_BQT):
  """Tile (qi, kj)'s mask [B, 1, 1, Q, T] and whether it needs computing."""
  q_first, k_first = qi * st.block_q, kj * st.block_kv
  mask_B11QT = tile_mask(st, q_first, k_first, st.kv_length - k_first,
                         seg_q_BQ, seg_k_BT, mask_BQT)[:, None, None]
  if mask_BQT is not None:
    return mask_B11QT, jnp.bool_(True)
  return mask_B11QT, tile_needed(st, q_first, k_first)


def tile_logits(st, q_BQGRK, k_BTGK):
  """Scaled (and soft-capped) float32 logits [B, G, R, Q, T], and tanh."""
  raw = jnp.einsum("bqgrk,btgk->bgrqt", q_BQGRK, k_BTGK,
                   preferred_element_type=jnp.float32) * st.scale
  if not st.logit_softcap:
    return raw, None
  tanh = jnp.tanh(raw / st.logit_softcap)
  return st.logit_softcap * tanh, tanh


def tile_backward(st, q_BQGRK, k_BTGK, v_BTGK, do_BQGRK, lse_BGRQ,
                  delta_BGRQ, mask_B11QT, dk_BTGK, dv_BTGK):
  """One tile's gradients: (dq [B, Q, G, R, K], dk_BTGK + the tile's dk,
  dv_BTGK + the tile's dv), all float32.

  Recomputes the tile's probabilities from the log-sum-exp `lse_BGRQ`;
  `delta_BGRQ` is rowsum(dO * O).
  """
  s_BGRQT, tanh_BGRQT = tile_logits(st, q_BQGRK, k_BTGK)
  p_BGRQT = jnp.where(mask_B11QT, jnp.exp(s_BGRQT - lse_BGRQ[..., None]),
                      0.0)
  dv_BTGK += jnp.einsum("bgrqt,bqgrk->btgk", p_BGRQT.astype(do_BQGRK.dtype),
                        do_BQGRK, preferred_element_type=jnp.float32)
  dp_BGRQT = jnp.einsum("bqgrk,btgk->bgrqt", do_BQGRK, v_BTGK,
                        preferred_element_type=jnp.float32)
  ds_BGRQT = p_BGRQT * (dp_BGRQT - delta_BGRQ[..., None])
  if tanh_BGRQT is not None:
    ds_BGRQT *= 1.0 - tanh_BGRQT ** 2
  ds_BGRQT *= st.scale
  dq_BQGRK = jnp.einsum("bgrqt,btgk->bqgrk", ds_BGRQT,
                        k_BTGK.astype(jnp.float32))
  dk_BTGK += jnp.einsum("bgrqt,bqgrk->btgk", ds_BGRQT,
                        q_BQGRK.astype(jnp.float32))
  return dq_BQGRK, dk_BTGK, dv_BTGK


def _split(st, q_BLHK, k_BSGK, v_BSGK, segment_ids_BL, mask_BLS):
  """Pads and splits the inputs into blocks along L and S."""
  batch, _, num_heads, head_dim = q_BLHK.shape
  num_kv_heads = k_BSGK.shape[2]
  q_BLGRK = pad_to(q_BLHK, 1, st.block_q).reshape(
      batch, -1, num_kv_heads, num_heads // num_kv_heads, head_dim)
  q_NBQGRK = split_blocks(q_BLGRK, 1, st.block_q)
  k_NBTGK = split_blocks(pad_to(k_BSGK, 1, st.block_kv), 1, st.block_kv)
  v_NBTGK = split_blocks(pad_to(v_BSGK, 1, st.block_kv), 1, st.block_kv)
  seg_q_NBQ = seg_k_NBT = mask_NNBQT = None
  if segment_ids_BL is not None:
    seg_q_NBQ = split_blocks(pad_to(segment_ids_BL, 1, st.block_q), 1,
                             st.block_q)
    seg_k_NBT = split_blocks(pad_to(segment_ids_BL, 1, st.block_kv), 1,
                             st.block_kv)
  if mask_BLS is not None:
    mask_BLS = pad_to(pad_to(mask_BLS, 1, st.block_q, False), 2,
                       st.block_kv, False)
    mask_NBQS = split_blocks(mask_BLS, 1, st.block_q)
    mask_NNBQT = jnp.moveaxis(split_blocks(mask_NBQS, 3, st.block_kv), 0, 1)
  return q_NBQGRK, k_NBTGK, v_NBTGK, seg_q_NBQ, seg_k_NBT, mask_NNBQT


def online_softmax_init(stat_shape, value_dim, sinks_H=None):
  """Running max, denominator and float32 output of an online softmax over
  rows `stat_shape` = [B, G, R, Q]; the sinks (H = G * R) start them."""
  if sinks_H is None:
    m_BGRQ = jnp.full(stat_shape, _HIDDEN, jnp.float32)
    l_BGRQ = jnp.zeros(stat_shape, jnp.float32)
  else:
    sinks_GR1 = sinks_H.astype(jnp.float32).reshape(*stat_shape[1:3], 1)
    m_BGRQ = jnp.broadcast_to(sinks_GR1, stat_shape)
    l_BGRQ = jnp.ones(stat_shape, jnp.float32)
  return m_BGRQ, l_BGRQ, jnp.zeros((*stat_shape, value_dim), jnp.float32)


def online_softmax_update(carry, s_BGRQT, mask_B11QT, v_BTGK):
  """Folds one block of keys (logits `s_BGRQT`, visible where
  `mask_B11QT`, values `v_BTGK`) into the running softmax `carry`."""
  m_BGRQ, l_BGRQ, acc_BGRQK = carry
  s_BGRQT = jnp.where(mask_B11QT, s_BGRQT, _HIDDEN)
  m_new = jnp.maximum(m_BGRQ, s_BGRQT.max(-1))
  p_BGRQT = jnp.where(mask_B11QT, jnp.exp(s_BGRQT - m_new[..., None]), 0.0)
  alpha_BGRQ = jnp.exp(m_BGRQ - m_new)
  pv_BGRQK = jnp.einsum("bgrqt,btgk->bgrqk", p_BGRQT.astype(v_BTGK.dtype),
                        v_BTGK, preferred_element_type=jnp.float32)
  return (m_new, l_BGRQ * alpha_BGRQ + p_BGRQT.sum(-1),
          acc_BGRQK * alpha_BGRQ[..., None] + pv_BGRQK)


def online_softmax_finish(carry):
  """Output [B, G, R, Q, K] (float32) and log-sum-exp [B, G, R, Q]."""
  m_BGRQ, l_BGRQ, acc_BGRQK = carry
  nonempty = l_BGRQ > 0
  o_BGRQK = acc_BGRQK / jnp.where(nonempty, l_BGRQ, 1.0)[..., None]
  # Rows with no visible key (padding only) get +inf: probabilities 0.
  lse_BGRQ = jnp.where(nonempty, m_BGRQ + jnp.log(l_BGRQ), jnp.inf)
  return o_BGRQK, lse_BGRQ


def _forward(st, q_BLHK, k_BSGK, v_BSGK, sinks_H, segment_ids_BL, mask_BLS):
  """Output [B, L, H, K] and log-sum-exp [N, B, G, R, Q] (sinks included)."""
  batch, length, num_heads, _ = q_BLHK.shape
  value_dim = v_BSGK.shape[-1]
  q_NBQGRK, k_NBTGK, v_NBTGK, seg_q_NBQ, seg_k_NBT, mask_NNBQT = _split(
      st, q_BLHK, k_BSGK, v_BSGK, segment_ids_BL, mask_BLS)
  _, _, _, num_kv_heads, group, _ = q_NBQGRK.shape
  init = online_softmax_init((batch, num_kv_heads, group, st.block_q),
                             value_dim, sinks_H)

  def query_block(_, xs):
    qi, q_BQGRK, seg_q_BQ, mask_NBQT = xs

    def key_block(carry, ys):
      kj, k_BTGK, v_BTGK, seg_k_BT, mask_BQT = ys

      mask_B11QT, needed = _tile(st, qi, kj, seg_q_BQ, seg_k_BT, mask_BQT)

      def update(carry):
        s_BGRQT, _ = tile_logits(st, q_BQGRK, k_BTGK)
        return online_softmax_update(carry, s_BGRQT, mask_B11QT, v_BTGK)

      return lax.cond(needed, update, lambda c: c, carry), None

    carry, _ = lax.scan(
        key_block, init,
        (jnp.arange(k_NBTGK.shape[0]), k_NBTGK, v_NBTGK, seg_k_NBT,
         mask_NBQT))
    o_BGRQK, lse_BGRQ = online_softmax_finish(carry)
    return None, (o_BGRQK.astype(v_BSGK.dtype), lse_BGRQ)

  _, (o_NBGRQK, lse_NBGRQ) = lax.scan(
      query_block, None,
      (jnp.arange(q_NBQGRK.shape[0]), q_NBQGRK, seg_q_NBQ, mask_NNBQT))
  o_BLHK = o_NBGRQK.transpose(1, 0, 4, 2, 3, 5).reshape(
      batch, -1, num_heads, value_dim)[:, :length]
  return o_BLHK, lse_NBGRQ


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _blockwise(st, q_BLHK, k_BSGK, v_BSGK, sinks_H, segment_ids_BL,
               mask_BLS):
  return _forward(st, q_BLHK, k_BSGK, v_BSGK, sinks_H, segment_ids_BL,
                  mask_BLS)[0]


def _blockwise_fwd(st, q_BLHK, k_BSGK, v_BSGK, sinks_H, segment_ids_BL,
                   mask_BLS):
  o_BLHK, lse_NBGRQ = _forward(st, q_BLHK, k_BSGK, v_BSGK, sinks_H,
                               segment_ids_BL, mask_BLS)
  residuals = (q_BLHK, k_BSGK, v_BSGK, sinks_H, segment_ids_BL, mask_BLS,
               o_BLHK, lse_NBGRQ)
  return o_BLHK, residuals


def _blockwise_bwd(st, residuals, do_BLHK):
  (q_BLHK, k_BSGK, v_BSGK, sinks_H, segment_ids_BL, mask_BLS, o_BLHK,
   lse_NBGRQ) = residuals
  batch, length, num_heads, _ = q_BLHK.shape
  kv_length, num_kv_heads = k_BSGK.shape[1:3]
  group = num_heads // num_kv_heads
  q_NBQGRK, k_NBTGK, v_NBTGK, seg_q_NBQ, seg_k_NBT, mask_NNBQT = _split(
      st, q_BLHK, k_BSGK, v_BSGK, segment_ids_BL, mask_BLS)
  do_NBQGRK = split_blocks(
      pad_to(do_BLHK, 1, st.block_q).reshape(batch, -1, num_kv_heads, group,
                                              do_BLHK.shape[-1]), 1,
      st.block_q)
  # D = rowsum(dO * O): the softmax backward's per-row correction.
  delta_BLH = jnp.einsum("blhk,blhk->blh", do_BLHK.astype(jnp.float32),
                         o_BLHK.astype(jnp.float32))
  delta_NBGRQ = jnp.moveaxis(
      split_blocks(pad_to(delta_BLH, 1, st.block_q), 1, st.block_q).reshape(
          -1, batch, st.block_q, num_kv_heads, group), 2, 4)
  mask_NNBQT = None if mask_NNBQT is None else jnp.moveaxis(mask_NNBQT, 0, 1)

  def key_block(dq_NBQGRK, xs):
    kj, k_BTGK, v_BTGK, seg_k_BT, mask_NBQT = xs

    def query_block(carry, ys):
      qi, q_BQGRK, do_BQGRK, lse_BGRQ, delta_BGRQ, seg_q_BQ, mask_BQT = ys

      mask_B11QT, needed = _tile(st, qi, kj, seg_q_BQ, seg_k_BT, mask_BQT)

      def update(carry):
        dq_NBQGRK, dk_BTGK, dv_BTGK = carry
        dq_BQGRK, dk_BTGK, dv_BTGK = tile_backward(
            st, q_BQGRK, k_BTGK, v_BTGK, do_BQGRK, lse_BGRQ, delta_BGRQ,
            mask_B11QT, dk_BTGK, dv_BTGK)
        return dq_NBQGRK.at[qi].add(dq_BQGRK), dk_BTGK, dv_BTGK

      return lax.cond(needed, update, lambda c: c, carry), None

    (dq_NBQGRK, dk_BTGK, dv_BTGK), _ = lax.scan(
        query_block, (dq_NBQGRK, jnp.zeros(k_BTGK.shape, jnp.float32),
                      jnp.zeros(v_BTGK.shape, jnp.float32)),
        (jnp.arange(q_NBQGRK.shape[0]), q_NBQGRK, do_NBQGRK, lse_NBGRQ,
         delta_NBGRQ, seg_q_NBQ, mask_NBQT))
    return dq_NBQGRK, (dk_BTGK, dv_BTGK)

  dq_NBQGRK, (dk_NBTGK, dv_NBTGK) = lax.scan(
      key_block, jnp.zeros(q_NBQGRK.shape, jnp.float32),
      (jnp.arange(k_NBTGK.shape[0]), k_NBTGK, v_NBTGK, seg_k_NBT,
       mask_NNBQT))

  def unblock(x_NB_K, heads, size):
    return jnp.moveaxis(x_NB_K, 0, 1).reshape(batch, -1, heads,
                                              x_NB_K.shape[-1])[:, :size]

  dq_BLHK = unblock(dq_NBQGRK, num_heads, length).astype(q_BLHK.dtype)
  dk_BSGK = unblock(dk_NBTGK, num_kv_heads, kv_length).astype(k_BSGK.dtype)
  dv_BSGK = unblock(dv_NBTGK, num_kv_heads, kv_length).astype(v_BSGK.dtype)
  dsinks_H = None
  if sinks_H is not None:
    # The sink is a key with value 0: d sink = -sum_rows p_sink * D.
    sinks_1GR1 = sinks_H.astype(jnp.float32).reshape(1, num_kv_heads, group,
                                                     1)
    p_sink_NBGRQ = jnp.exp(sinks_1GR1 - lse_NBGRQ)
    dsinks_H = -(p_sink_NBGRQ * delta_NBGRQ).sum((0, 1, 4)).reshape(
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
  attention._check_mask_args(  # pylint: disable=protected-access
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
