"""Causal self-attention kernels: a plain-JAX reference and a fused one.

Both take the same arguments and compute the same function:
  o[b, i, h] = sum_j softmax_j(scale * q[b, i, h] . k[b, j, g]) v[b, j, g],
  g = h // R,
over keys j allowed by the mask: causal (j <= i), within the sliding window
(i - j < window) when a window is given, and in the same segment as i when
segment ids are given (packed sequences). R = H // G query heads share one
key/value head (GQA; MQA when G == 1). With attention sinks (GPT-OSS), query
head h also has a learned logit `sinks_H[h]` that joins every row's softmax
denominator and attends to nothing:
  o[b, i, h] = sum_j exp(l_j) v_j / (exp(sinks_H[h]) + sum_j exp(l_j)).
Decoding with a KV cache passes an
explicit `mask_BLS` instead (see `positions_mask`): queries then see cached
keys by position, and S may differ from L.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp


def attention_mask(
    length: int,
    window: int | None = None,
    segment_ids_BL: jax.Array | None = None,
) -> jax.Array:
  """Boolean mask [B or 1, L, S]: True where query i may attend to key j."""
  i_L1 = jnp.arange(length)[:, None]
  j_1S = jnp.arange(length)[None, :]
  mask_LS = j_1S <= i_L1
  if window is not None:
    mask_LS &= i_L1 - j_1S < window
  mask_BLS = mask_LS[None]
  if segment_ids_BL is not None:
    mask_BLS &= segment_ids_BL[:, :, None] == segment_ids_BL[:, None, :]
  return mask_BLS


def positions_mask(
    q_positions_BL: jax.Array,
    kv_length: int,
    window: int | None = None,
    chunk: int | None = None,
) -> jax.Array:
  """Boolean mask [B, L, S] of queries at `q_positions_BL` over a KV cache
  whose slot j holds the key at position j: causal, within the window and
  within the query's chunk of positions (`chunk_segment_ids`)."""
  q_BL1 = q_positions_BL[:, :, None]
  j_11S = jnp.arange(kv_length)[None, None, :]
  mask_BLS = j_11S <= q_BL1
  if window is not None:
    mask_BLS &= q_BL1 - j_11S < window
  if chunk is not None:
    mask_BLS &= q_BL1 // chunk == j_11S // chunk
  return mask_BLS


def with_blocks(mask_BLS: jax.Array, q_blocks_BL: jax.Array,
                kv_blocks_BS: jax.Array) -> jax.Array:
  """`mask_BLS` [B or 1, L, S] also True where query i and key j are in
  the same block (equal ids >= 0: one image's tokens, which attend to each
  other bidirectionally; -1 marks tokens of no block)."""
  q_BL1 = q_blocks_BL[:, :, None]
  return mask_BLS | ((q_BL1 == kv_blocks_BS[:, None, :]) & (q_BL1 >= 0))


def chunk_segment_ids(positions_BL: jax.Array, chunk: int,
                      segment_ids_BL: jax.Array | None = None) -> jax.Array:
  """Segment ids [B, L] that make causal attention chunked: a token sees only
  the earlier tokens of its segment whose positions p share its p // chunk
  (Llama 4's chunked attention). Every kernel then runs it as packed
  sequences: each (segment, chunk) run of a row gets its own id."""
  key_BL = positions_BL // chunk
  new_BL = key_BL[:, 1:] != key_BL[:, :-1]
  if segment_ids_BL is not None:
    new_BL |= segment_ids_BL[:, 1:] != segment_ids_BL[:, :-1]
  starts_BL = jnp.concatenate(
      [jnp.ones_like(new_BL[:, :1]), new_BL], axis=1)
  return jnp.cumsum(starts_BL.astype(jnp.int32), axis=1)


def check_mask_args(mask_BLS, window, segment_ids_BL):
  """Raises ValueError when an explicit mask comes with a window or segment
  ids (the attention functions take one or the other)."""
  if mask_BLS is not None and (window is not None or
                               segment_ids_BL is not None):
    raise ValueError("Give mask_BLS or window/segment_ids_BL, not both: an "
                     "explicit mask replaces the causal, window and segment "
                     "masks.")


def reference_attention(
    q_BLHK: jax.Array,
    k_BSGK: jax.Array,
    v_BSGK: jax.Array,
    *,
    scale: float,
    window: int | None = None,
    segment_ids_BL: jax.Array | None = None,
    logit_softcap: float = 0.0,
    mask_BLS: jax.Array | None = None,
    sinks_H: jax.Array | None = None,
) -> jax.Array:
  """Plain-JAX attention; logits and softmax in float32.

  Args:
    q_BLHK: Queries.
    k_BSGK: Keys.
    v_BSGK: Values.
    scale: Multiplier of the query-key dot products.
    window: A query sees this many keys, itself included; None: no window.
    segment_ids_BL: Tokens attend only to tokens with the same id.
    logit_softcap: Logits become `c * tanh(logits / c)`; 0 is off.
    mask_BLS: Explicit mask (True: may attend) replacing the causal, window
      and segment masks, e.g. `positions_mask` over a KV cache.
    sinks_H: Attention-sink logit of each query head (float32, in the units
      of the scaled logits); None: no sinks.

  Returns:
    Attention output [B, L, H, K] in the dtype of `v_BSGK`.
  """
  check_mask_args(mask_BLS, window, segment_ids_BL)
  batch, length, num_heads, head_dim = q_BLHK.shape
  num_kv_heads = k_BSGK.shape[2]
  q_BLGRK = q_BLHK.reshape(batch, length, num_kv_heads,
                           num_heads // num_kv_heads, head_dim)
  logits_BGRLS = jnp.einsum("blgrk,bsgk->bgrls", q_BLGRK, k_BSGK,
                            preferred_element_type=jnp.float32) * scale
  if logit_softcap:
    logits_BGRLS = logit_softcap * jnp.tanh(logits_BGRLS / logit_softcap)
  if mask_BLS is None:
    mask_BLS = attention_mask(length, window, segment_ids_BL)
  mask_B11LS = mask_BLS[:, None, None]
  logits_BGRLS = jnp.where(mask_B11LS, logits_BGRLS,
                           jnp.finfo(jnp.float32).min)
  if sinks_H is None:
    probs_BGRLS = jax.nn.softmax(logits_BGRLS, axis=-1)
  else:
    # The sink joins each row as one more key, dropped after the softmax.
    sinks_BGRL1 = jnp.broadcast_to(
        sinks_H.astype(jnp.float32).reshape(
            1, num_kv_heads, num_heads // num_kv_heads, 1, 1),
        (*logits_BGRLS.shape[:-1], 1))
    probs_BGRLS = jax.nn.softmax(
        jnp.concatenate([logits_BGRLS, sinks_BGRL1], axis=-1),
        axis=-1)[..., :-1]
  probs_BGRLS = probs_BGRLS.astype(v_BSGK.dtype)
  o_BLGRK = jnp.einsum("bgrls,bsgk->blgrk", probs_BGRLS, v_BSGK)
  return o_BLGRK.reshape(batch, length, num_heads, v_BSGK.shape[-1])


def xla_attention(
    q_BLHK: jax.Array,
    k_BSGK: jax.Array,
    v_BSGK: jax.Array,
    *,
    scale: float,
    window: int | None = None,
    segment_ids_BL: jax.Array | None = None,
    logit_softcap: float = 0.0,
    mask_BLS: jax.Array | None = None,
    sinks_H: jax.Array | None = None,
    implementation: str | None = None,
) -> jax.Array:
  """`jax.nn.dot_product_attention`: same arguments as `reference_attention`.

  `implementation` is passed on: None lets JAX choose (JAX 0.10 picks XLA on
  every platform), "cudnn" asks for cuDNN flash attention (GPU, bf16/fp16).
  The causal mask and window are passed as such, so a fused
  backend need not materialise them; only segment ids become an explicit
  mask.

  Raises:
    ValueError: `logit_softcap` or `sinks_H` is set (no fused backend
      supports them).
  """
  if logit_softcap:
    raise ValueError(
        f"xla_attention has no attention-logit soft-cap (got {logit_softcap});"
        " use reference_attention.")
  if sinks_H is not None:
    raise ValueError("xla_attention has no attention sinks (got sinks_H of "
                     f"shape {sinks_H.shape}); use reference_attention.")
  check_mask_args(mask_BLS, window, segment_ids_BL)
  # One head dim for all three: zero-pad the narrower side (MLA's values),
  # which changes neither the logits nor the kept output columns.
  value_dim = v_BSGK.shape[-1]
  width = max(value_dim, q_BLHK.shape[-1])

  def pad(x):
    return jnp.pad(x, ((0, 0),) * 3 + ((0, width - x.shape[-1]),))

  q_BLHK, k_BSGK, v_BSGK = pad(q_BLHK), pad(k_BSGK), pad(v_BSGK)
  if mask_BLS is not None:
    return jax.nn.dot_product_attention(
        q_BLHK, k_BSGK, v_BSGK, mask=mask_BLS[:, None], scale=scale,
        implementation=implementation)[..., :value_dim]
  mask_B1LS = None
  if segment_ids_BL is not None:
    length = q_BLHK.shape[1]
    mask_B1LS = attention_mask(length, None, segment_ids_BL)[:, None]
  return jax.nn.dot_product_attention(
      q_BLHK,
      k_BSGK,
      v_BSGK,
      mask=mask_B1LS,
      scale=scale,
      is_causal=True,
      local_window_size=None if window is None else (window - 1, 0),
      implementation=implementation,
  )[..., :value_dim]


IMPLEMENTATIONS: dict[str, Callable[..., jax.Array]] = {
    "reference": reference_attention,
    "xla": xla_attention,
}
