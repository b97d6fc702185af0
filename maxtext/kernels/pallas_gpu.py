"""Flash attention for GPUs as Pallas kernels lowered to Triton.

Same function and arguments as `attention.reference_attention` (no explicit
`mask_BLS`: causal, an optional sliding window, segment ids), with the two
features cuDNN's flash attention lacks: the logit soft-cap and attention
sinks. Three `pl.pallas_call`s, in the manner of jax's
`jax.experimental.pallas.ops.gpu.attention` (FlashAttention-2):

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
bounds, as in jax's kernel). Segment ids mask inside the tiles. D and the
sinks' gradient, -sum p_sink D, are elementwise XLA outside the kernels.

Triton wants power-of-two tiles of at least 16: the length is padded at the
end to a multiple of the tiles (under the causal mask no real query sees a
padded key) and the head dims to a power of two (zero columns change neither
the logits nor the kept output columns). `interpret=True` runs the kernels
through Pallas' interpreter on any backend (the CPU tests).

Shape key: B batch, L length (Lp padded), H query heads, G key/value heads,
R = H // G, K head dim; Q query tile, T key tile.
"""

import functools
import math
from typing import NamedTuple

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
import jax.numpy as jnp

from maxtext.kernels import backend

_LOG2E = math.log2(math.e)
# Base-2 logit of a hidden key: finite, so that `max` and `exp2` stay
# NaN-free.
_HIDDEN = -1e30
# Largest tiles for head-dim rows of up to _ROW_BYTES (bfloat16 K <= 128),
# shrunk in proportion for wider rows: the forward's Q x T logits and Q x K
# accumulator, the backward's two T x K accumulators and the pipelined
# K/V tiles must fit one SM's registers and shared memory (compiled for an
# H100, float32 K = 128 at 128 x 128 asks for 262,656 bytes of shared memory
# of the 232,448). Untuned: no GPU has timed them; jax's kernel defaults to
# 128 forward, 32 backward.
_MAX_BLOCK = 128
_MAX_BACKWARD_BLOCK = 64
_ROW_BYTES = 256
_MIN_BLOCK = 16  # Triton's smallest `dot` operand dimension.


class _Static(NamedTuple):
  """Hashable non-array arguments of the custom-vjp function."""
  scale: float
  window: int | None
  logit_softcap: float
  block_q: int  # Forward tiles.
  block_kv: int
  backward_block_q: int  # dq and dk/dv tiles.
  backward_block_kv: int
  interpret: bool


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


def _forward_kernel(q_ref, k_ref, v_ref, seg_ref, sinks_ref, o_ref, lse_ref,
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


def _dq_kernel(q_ref, k_ref, v_ref, seg_ref, do_ref, lse_ref, delta_ref,
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


def _dkv_kernel(q_ref, k_ref, v_ref, seg_ref, do_ref, lse_ref, delta_ref,
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


def _pad(x, axis, size):
  """Zero-pads `axis` at the end to `size`."""
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, size - x.shape[axis])
  return jnp.pad(x, widths)


def _pad_inputs(st, q_BLHK, k_BLGK, v_BLGK, segment_ids_BL):
  """Pads the length to the tiles (powers of two: the largest is a multiple
  of the others) and the head dims to powers of two."""
  tile = max(st.block_q, st.block_kv)
  padded = pl.cdiv(q_BLHK.shape[1], tile) * tile

  def pad(x_BL_K):
    return _pad(_pad(x_BL_K, 1, padded), 3,
                max(_MIN_BLOCK, pl.next_power_of_2(x_BL_K.shape[3])))

  segments_BLp = (None if segment_ids_BL is None else
                  _pad(segment_ids_BL.astype(jnp.int32), 1, padded))
  return pad(q_BLHK), pad(k_BLGK), pad(v_BLGK), segments_BLp


def _compiler_params(num_warps):
  return plgpu.CompilerParams(num_warps=num_warps, num_stages=2)


def _forward(st, q_BLHK, k_BLGK, v_BLGK, sinks_H, segment_ids_BL):
  """Output [B, L, H, Kv] and log-sum-exp [B, H, Lp] (natural units)."""
  batch, length, num_heads, _ = q_BLHK.shape
  value_dim = v_BLGK.shape[-1]
  group = num_heads // k_BLGK.shape[2]
  q_BLHK, k_BLGK, v_BLGK, segments_BL = _pad_inputs(st, q_BLHK, k_BLGK,
                                                    v_BLGK, segment_ids_BL)
  padded, head_dim, padded_value_dim = (q_BLHK.shape[1], q_BLHK.shape[3],
                                        v_BLGK.shape[3])
  keys = (None, padded, None, head_dim)
  values = (None, padded, None, padded_value_dim)
  o_BLHK, lse_BHL = pl.pallas_call(
      functools.partial(_forward_kernel, st=st),
      grid=(padded // st.block_q, batch, num_heads),
      in_specs=[
          pl.BlockSpec((None, st.block_q, None, head_dim),
                       lambda i, b, h: (b, i, h, 0)),
          pl.BlockSpec(keys, lambda i, b, h: (b, 0, h // group, 0)),
          pl.BlockSpec(values, lambda i, b, h: (b, 0, h // group, 0)),
          None if segments_BL is None else pl.BlockSpec(
              (None, padded), lambda i, b, h: (b, 0)),
          None if sinks_H is None else pl.BlockSpec(
              (None,), lambda i, b, h: (h,)),
      ],
      out_specs=[
          pl.BlockSpec((None, st.block_q, None, padded_value_dim),
                       lambda i, b, h: (b, i, h, 0)),
          pl.BlockSpec((None, None, st.block_q), lambda i, b, h: (b, h, i)),
      ],
      out_shape=[
          jax.ShapeDtypeStruct((batch, padded, num_heads, padded_value_dim),
                               v_BLGK.dtype),
          jax.ShapeDtypeStruct((batch, num_heads, padded), jnp.float32),
      ],
      compiler_params=_compiler_params(
          4 if max(head_dim, padded_value_dim) <= 64 else 8),
      interpret=st.interpret,
      name="pallas_gpu_attention_forward",
  )(q_BLHK, k_BLGK, v_BLGK, segments_BL,
    None if sinks_H is None else sinks_H.astype(jnp.float32))
  return o_BLHK[:, :length, :, :value_dim], lse_BHL


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(st, q_BLHK, k_BLGK, v_BLGK, sinks_H, segment_ids_BL):
  return _forward(st, q_BLHK, k_BLGK, v_BLGK, sinks_H, segment_ids_BL)[0]


def _flash_fwd(st, q_BLHK, k_BLGK, v_BLGK, sinks_H, segment_ids_BL):
  o_BLHK, lse_BHL = _forward(st, q_BLHK, k_BLGK, v_BLGK, sinks_H,
                             segment_ids_BL)
  return o_BLHK, (q_BLHK, k_BLGK, v_BLGK, sinks_H, segment_ids_BL, o_BLHK,
                  lse_BHL)


def _flash_bwd(st, residuals, do_BLHK):
  (q_BLHK, k_BLGK, v_BLGK, sinks_H, segment_ids_BL, o_BLHK,
   lse_BHL) = residuals
  batch, length, num_heads, query_dim = q_BLHK.shape
  num_kv_heads, value_dim = v_BLGK.shape[2:]
  group = num_heads // num_kv_heads
  # D = rowsum(dO * O): the softmax backward's per-row correction.
  delta_BHL = jnp.einsum("blhk,blhk->bhl", do_BLHK.astype(jnp.float32),
                         o_BLHK.astype(jnp.float32))
  q_BLHK, k_BLGK, v_BLGK, segments_BL = _pad_inputs(st, q_BLHK, k_BLGK,
                                                    v_BLGK, segment_ids_BL)
  padded, head_dim = q_BLHK.shape[1], q_BLHK.shape[3]
  padded_value_dim = v_BLGK.shape[3]
  do_BLHK = _pad(_pad(do_BLHK, 1, padded), 3, padded_value_dim)
  delta_BHL = _pad(delta_BHL, 2, padded)
  block_q, block_kv = st.backward_block_q, st.backward_block_kv
  segments = None if segments_BL is None else pl.BlockSpec(
      (None, padded), lambda i, b, h: (b, 0))
  # jax's heuristic for tiles under 128 x 128.
  compiler_params = _compiler_params(num_warps=4)
  inputs = (q_BLHK, k_BLGK, v_BLGK, segments_BL, do_BLHK, lse_BHL, delta_BHL)

  def whole(dim):
    return (None, padded, None, dim)

  dq_BLHK = pl.pallas_call(
      functools.partial(_dq_kernel, st=st),
      grid=(padded // block_q, batch, num_heads),
      in_specs=[
          pl.BlockSpec((None, block_q, None, head_dim),
                       lambda i, b, h: (b, i, h, 0)),
          pl.BlockSpec(whole(head_dim), lambda i, b, h: (b, 0, h // group, 0)),
          pl.BlockSpec(whole(padded_value_dim),
                       lambda i, b, h: (b, 0, h // group, 0)),
          segments,
          pl.BlockSpec((None, block_q, None, padded_value_dim),
                       lambda i, b, h: (b, i, h, 0)),
          pl.BlockSpec((None, None, block_q), lambda i, b, h: (b, h, i)),
          pl.BlockSpec((None, None, block_q), lambda i, b, h: (b, h, i)),
      ],
      out_specs=pl.BlockSpec((None, block_q, None, head_dim),
                             lambda i, b, h: (b, i, h, 0)),
      out_shape=jax.ShapeDtypeStruct(q_BLHK.shape, q_BLHK.dtype),
      compiler_params=compiler_params,
      interpret=st.interpret,
      name="pallas_gpu_attention_dq",
  )(*inputs)

  # The R query heads of key/value head g are heads g * R .. g * R + R - 1:
  # one block of R along the heads axis.
  dk_BLGK, dv_BLGK = pl.pallas_call(
      functools.partial(_dkv_kernel, st=st, group=group),
      grid=(padded // block_kv, batch, num_kv_heads),
      in_specs=[
          pl.BlockSpec((None, padded, group, head_dim),
                       lambda j, b, g: (b, 0, g, 0)),
          pl.BlockSpec((None, block_kv, None, head_dim),
                       lambda j, b, g: (b, j, g, 0)),
          pl.BlockSpec((None, block_kv, None, padded_value_dim),
                       lambda j, b, g: (b, j, g, 0)),
          segments,
          pl.BlockSpec((None, padded, group, padded_value_dim),
                       lambda j, b, g: (b, 0, g, 0)),
          pl.BlockSpec((None, group, padded), lambda j, b, g: (b, g, 0)),
          pl.BlockSpec((None, group, padded), lambda j, b, g: (b, g, 0)),
      ],
      out_specs=[
          pl.BlockSpec((None, block_kv, None, head_dim),
                       lambda j, b, g: (b, j, g, 0)),
          pl.BlockSpec((None, block_kv, None, padded_value_dim),
                       lambda j, b, g: (b, j, g, 0)),
      ],
      out_shape=[jax.ShapeDtypeStruct(k_BLGK.shape, k_BLGK.dtype),
                 jax.ShapeDtypeStruct(v_BLGK.shape, v_BLGK.dtype)],
      compiler_params=compiler_params,
      interpret=st.interpret,
      name="pallas_gpu_attention_dkv",
  )(*inputs)

  dsinks_H = None
  if sinks_H is not None:
    # The sink is a key with value 0: d sink = -sum_rows p_sink * D.
    p_sink_BHL = jnp.exp(sinks_H.astype(jnp.float32)[:, None] -
                         lse_BHL[:, :, :length])
    dsinks_H = -(p_sink_BHL * delta_BHL[:, :, :length]).sum(
        (0, 2)).astype(sinks_H.dtype)
  return (dq_BLHK[:, :length, :, :query_dim],
          dk_BLGK[:, :length, :, :query_dim],
          dv_BLGK[:, :length, :, :value_dim], dsinks_H, None)


_flash.defvjp(_flash_fwd, _flash_bwd)


def _tile(name, block, length, cap):
  """The tile for `block` over `length`: at most `cap`, and no larger than
  the length needs.

  Raises:
    ValueError: `block` is not a power of two of at least 16.
  """
  if block < _MIN_BLOCK or block & (block - 1):
    raise ValueError(f"pallas_gpu_attention: {name}={block} must be a power "
                     f"of two >= {_MIN_BLOCK} (Triton tiles).")
  return min(block, cap, max(_MIN_BLOCK, pl.next_power_of_2(length)))


def pallas_gpu_attention(
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
    block_q: int = 128,
    block_kv: int = 128,
    interpret: bool | None = None,
) -> jax.Array:
  """Triton flash attention; arguments as `attention.reference_attention`.

  Args:
    q_BLHK: Queries.
    k_BSGK: Keys (S == L).
    v_BSGK: Values (their head dim may differ from the keys').
    scale: Multiplier of the query-key dot products.
    window: A query sees this many keys, itself included; None: no window.
    segment_ids_BL: Tokens attend only to tokens with the same id.
    logit_softcap: Logits become `c * tanh(logits / c)`; 0 is off.
    sinks_H: Per-query-head sink logit (scaled-logit units) that joins the
      softmax denominator with a zero value; None: no sinks.
    mask_BLS: Not supported (must be None); decoding uses another kernel.
    block_q: Query tile of the forward kernel, a power of two >= 16, capped
      at 128 and at the length rounded up to a power of two; the backward
      kernels cap it at 64. Head-dim rows wider than 256 bytes (bfloat16
      K > 128, float32 K > 64) shrink both caps in proportion.
    block_kv: Key tile, likewise.
    interpret: Run the kernels in Pallas' interpreter (any backend; slow);
      None: unless the computation targets a GPU
      (`backend.target_platform()`).

  Returns:
    Attention output [B, L, H, K] in the dtype of `v_BSGK`.

  Raises:
    ValueError: `mask_BLS` is given, the key length differs from L, or a
      block is not a power of two >= 16.
  """
  if mask_BLS is not None:
    raise ValueError("pallas_gpu_attention takes no explicit mask_BLS "
                     "(decoding over a KV cache); use impl 'blockwise' or "
                     "'reference'.")
  length, kv_length = q_BLHK.shape[1], k_BSGK.shape[1]
  if kv_length != length:
    raise ValueError(f"pallas_gpu_attention needs as many keys as queries; "
                     f"got L={length}, S={kv_length}.")
  row_bytes = max(pl.next_power_of_2(x.shape[3]) * x.dtype.itemsize
                  for x in (q_BLHK, v_BSGK))
  shrink = max(1, row_bytes // _ROW_BYTES)
  cap, backward_cap = (max(_MIN_BLOCK, c // shrink)
                       for c in (_MAX_BLOCK, _MAX_BACKWARD_BLOCK))
  block_q = _tile("block_q", block_q, length, cap)
  block_kv = _tile("block_kv", block_kv, length, cap)
  if interpret is None:
    interpret = backend.target_platform() != "gpu"
  st = _Static(scale=float(scale), window=window,
               logit_softcap=float(logit_softcap), block_q=block_q,
               block_kv=block_kv,
               backward_block_q=min(block_q, backward_cap),
               backward_block_kv=min(block_kv, backward_cap),
               interpret=bool(interpret))
  return _flash(st, q_BLHK, k_BSGK, v_BSGK, sinks_H, segment_ids_BL)
