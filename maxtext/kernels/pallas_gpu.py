"""Flash attention for GPUs as Pallas kernels lowered to Triton.

Same function and arguments as `attention.reference_attention` (no explicit
`mask_BLS`: causal, an optional sliding window, segment ids), with the two
features cuDNN's flash attention lacks: the logit soft-cap and attention
sinks. Three `pl.pallas_call`s, in the manner of jax's
`jax.experimental.pallas.ops.gpu.attention` (FlashAttention-2): the forward
(output and per-row log-sum-exp), dq, and dk/dv, whose kernel bodies and
tile walks are in `maxtext.kernels.pallas_gpu_kernels`. This module pads
the inputs, lays out the grids and tiles, and ties the three together with
a custom VJP. D = rowsum(dO O) and the sinks' gradient, -sum p_sink D, are
elementwise XLA outside the kernels.

Triton wants power-of-two tiles of at least 16: the length is padded at the
end to a multiple of the tiles (under the causal mask no real query sees a
padded key) and the head dims to a power of two (zero columns change neither
the logits nor the kept output columns). `interpret=True` runs the kernels
through Pallas' interpreter on any backend (the CPU tests).

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import functools
from typing import NamedTuple

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
import jax.numpy as jnp

from maxtext.kernels import backend
from maxtext.kernels import pallas_gpu_kernels

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

  segments_padded_BL = (None if segment_ids_BL is None else
                  _pad(segment_ids_BL.astype(jnp.int32), 1, padded))
  return pad(q_BLHK), pad(k_BLGK), pad(v_BLGK), segments_padded_BL


def _compiler_params(num_warps):
  return plgpu.CompilerParams(num_warps=num_warps, num_stages=2)


def _forward(st, q_BLHK, k_BLGK, v_BLGK, sinks_H, segment_ids_BL):
  """Output [B, L, H, U] and log-sum-exp [B, H, padded L] (natural units)."""
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
      functools.partial(pallas_gpu_kernels.forward_kernel, st=st),
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
      functools.partial(pallas_gpu_kernels.dq_kernel, st=st),
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
      functools.partial(pallas_gpu_kernels.dkv_kernel, st=st, group=group),
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
