"""TPU splash attention (the Pallas kernel that ships with jax).

Same function and arguments as `attention.reference_attention` (no explicit
`mask_BLS`: the mask is static, causal or local, plus segment ids). The
kernel is multi-query per key/value head: it runs once per (batch row, key/
value head) over the R query heads that share it (`jax.vmap`), so GQA needs
no repeated K/V. Queries are multiplied by `scale` before the kernel, so
soft-cap and sinks are in scaled-logit units as in the reference. The length
is padded at the end to a multiple of the blocks: under the causal mask no
real query sees a padded key.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel as splash_kernel)
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_mask as splash_mask)


def _pad_length(x, axis, length):
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, length - x.shape[axis])
  return jnp.pad(x, widths)


def splash_attention(
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
    interpret: bool = False,
) -> jax.Array:
  """Splash attention; arguments as `attention.reference_attention`.

  Args:
    q_BLHK: Queries.
    k_BSGK: Keys (S == L).
    v_BSGK: Values.
    scale: Multiplier of the query-key dot products.
    window: A query sees this many keys, itself included; None: no window.
    segment_ids_BL: Tokens attend only to tokens with the same id.
    logit_softcap: Logits become `c * tanh(logits / c)`; 0 is off.
    sinks_H: Per-query-head sink logit (scaled-logit units); None: none.
    mask_BLS: Not supported (must be None); decoding uses another kernel.
    block_q: Query block of the forward and backward kernels (capped at the
      padded length).
    block_kv: Key block of the forward and backward kernels.
    interpret: Run the Pallas kernels in interpret mode (any backend; slow).

  Returns:
    Attention output [B, L, H, K] in the dtype of `v_BSGK`.

  Raises:
    ValueError: `mask_BLS` is given or the key length differs from L.
  """
  if mask_BLS is not None:
    raise ValueError("splash_attention takes no explicit mask_BLS (decoding "
                     "over a KV cache); use impl 'blockwise' or 'reference'.")
  batch, length, num_heads, head_dim = q_BLHK.shape
  num_kv_heads = k_BSGK.shape[2]
  group = num_heads // num_kv_heads
  if k_BSGK.shape[1] != length:
    raise ValueError(f"splash_attention needs as many keys as queries; got "
                     f"L={length}, S={k_BSGK.shape[1]}.")
  block_q = min(block_q, 128 * math.ceil(length / 128))
  block_kv = min(block_kv, 128 * math.ceil(length / 128))
  padded = math.lcm(block_q, block_kv) * math.ceil(
      length / math.lcm(block_q, block_kv))
  shape = (padded, padded)
  if window is None:
    head_mask = splash_mask.CausalMask(shape)
  else:
    head_mask = splash_mask.LocalMask(shape, window_size=(window - 1, 0),
                                      offset=0)
  kernel = splash_kernel.make_splash_mqa_single_device(
      splash_mask.MultiHeadMask([head_mask] * group),
      block_sizes=splash_kernel.BlockSizes(
          block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
          block_q_dkv=block_q, block_kv_dkv=block_kv,
          block_kv_dkv_compute=block_kv, block_q_dq=block_q,
          block_kv_dq=block_kv),
      attn_logits_soft_cap=logit_softcap or None,
      interpret=interpret)

  q_BGRLK = _pad_length(
      (q_BLHK * jnp.asarray(scale, q_BLHK.dtype)).reshape(
          batch, length, num_kv_heads, group, head_dim), 1,
      padded).transpose(0, 2, 3, 1, 4)
  k_BGLK = _pad_length(k_BSGK, 1, padded).transpose(0, 2, 1, 3)
  v_BGLK = _pad_length(v_BSGK, 1, padded).transpose(0, 2, 1, 3)
  sinks_GR = (None if sinks_H is None else
              sinks_H.astype(jnp.float32).reshape(num_kv_heads, group))
  segments_BL = (None if segment_ids_BL is None else
                 _pad_length(segment_ids_BL, 1, padded))

  def one_row(q_GRLK, k_GLK, v_GLK, segments_L):
    segment_ids = (None if segments_L is None else
                   splash_kernel.SegmentIds(q=segments_L, kv=segments_L))

    def one_head(q_RLK, k_LK, v_LK, sinks_R):
      return kernel(q_RLK, k_LK, v_LK, segment_ids=segment_ids,
                    sinks=sinks_R)

    return jax.vmap(one_head, in_axes=(0, 0, 0, None if sinks_GR is None
                                       else 0))(q_GRLK, k_GLK, v_GLK,
                                                sinks_GR)

  o_BGRLK = jax.vmap(one_row)(q_BGRLK, k_BGLK, v_BGLK, segments_BL)
  o_BLHK = o_BGRLK.transpose(0, 3, 1, 2, 4).reshape(batch, padded, num_heads,
                                                    -1)
  return o_BLHK[:, :length].astype(v_BSGK.dtype)
