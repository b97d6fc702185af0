"""Decode attention over a paged KV cache: one new query per sequence.

The cache is a pool of pages, `k_pages_PpGK` / `v_pages_PpGK` [P, p, G, K];
sequence b owns pages `page_table_BN[b, 0], page_table_BN[b, 1], ...` in
order, so its token at position t sits in page `page_table_BN[b, t // p]`,
slot `t % p`. Sequence b holds `lengths_B[b]` tokens, the last of which is
the query's own: the query (at position lengths_B[b] - 1) attends causally to
positions 0 .. lengths_B[b] - 1, within `window` and its `chunk` of
positions when given.

Three implementations, one signature:

  reference  gathers each sequence's pages into a dense cache and calls
             `attention.reference_attention` with `positions_mask`.
  jax        plain JAX: a `lax.scan` over page-table columns with an online
             softmax (`blockwise.online_softmax_*`); pages past every
             sequence's length are skipped; memory O(B * T) per step.
  pallas     the TPU kernel shipped with jax
             (`jax.experimental.pallas.ops.tpu.paged_attention`); TPU only,
             no window and no sinks; head dim a multiple of 128; bfloat16
             keys and values (Mosaic fails to compile its float32 matmuls
             on a v5e: "Bad rhs type"). It wants
             the pages head-major, [G, P, p, K]: this wrapper transposes
             them (a cache meant for it should store that layout).
  auto       pallas on TPU where it serves the call, else jax.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import jax
from jax import lax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.paged_attention import (
    paged_attention_kernel)

from maxtext.kernels import attention
from maxtext.kernels import backend
from maxtext.kernels import blockwise

IMPLS = ("auto", "reference", "jax", "pallas")


def reference_paged_attention(q_BHK, k_pages_PpGK, v_pages_PpGK,
                              page_table_BN, lengths_B, *, scale,
                              window=None, chunk=None, logit_softcap=0.0,
                              sinks_H=None):
  """Dense gather, then `attention.reference_attention`; returns [B, H, K]."""
  batch, pages = page_table_BN.shape
  _, page_size, num_kv_heads, _ = k_pages_PpGK.shape

  def dense(pages_PpGK):
    return pages_PpGK[page_table_BN].reshape(batch, pages * page_size,
                                             num_kv_heads, -1)

  mask_BLS = attention.positions_mask(lengths_B[:, None] - 1,
                                      pages * page_size, window, chunk)
  o_B1HK = attention.reference_attention(
      q_BHK[:, None], dense(k_pages_PpGK), dense(v_pages_PpGK), scale=scale,
      logit_softcap=logit_softcap, mask_BLS=mask_BLS, sinks_H=sinks_H)
  return o_B1HK[:, 0]


def _jax_paged_attention(q_BHK, k_pages_PpGK, v_pages_PpGK, page_table_BN,
                         lengths_B, *, scale, window, chunk, logit_softcap,
                         sinks_H):
  k_pages_PpGK, v_pages_PpGK = jnp.asarray(k_pages_PpGK), jnp.asarray(
      v_pages_PpGK)
  batch, num_heads, head_dim = q_BHK.shape
  _, page_size, num_kv_heads, value_dim = v_pages_PpGK.shape
  group = num_heads // num_kv_heads
  q_B1GRK = q_BHK.reshape(batch, 1, num_kv_heads, group, head_dim)
  last_B = lengths_B - 1

  def page(carry, xs):
    column, page_ids_B = xs
    first = column * page_size

    def update(carry):
      s_BGR1p = jnp.einsum("bqgrk,btgk->bgrqt", q_B1GRK,
                           k_pages_PpGK[page_ids_B],
                           preferred_element_type=jnp.float32) * scale
      if logit_softcap:
        s_BGR1p = logit_softcap * jnp.tanh(s_BGR1p / logit_softcap)
      position_1p = first + jnp.arange(page_size)[None]
      mask_Bp = position_1p <= last_B[:, None]
      if window is not None:
        mask_Bp &= last_B[:, None] - position_1p < window
      if chunk is not None:
        mask_Bp &= position_1p // chunk == last_B[:, None] // chunk
      return blockwise.online_softmax_update(
          carry, s_BGR1p, mask_Bp[:, None, None, None],
          v_pages_PpGK[page_ids_B])

    needed = first <= last_B.max()
    if window is not None:
      needed &= (last_B - (first + page_size - 1) < window).any()
    if chunk is not None:  # The page ends at or after a query's chunk start.
      needed &= (first + page_size - 1 >= last_B // chunk * chunk).any()
    return lax.cond(needed, update, lambda c: c, carry), None

  carry, _ = lax.scan(
      page,
      blockwise.online_softmax_init((batch, num_kv_heads, group, 1),
                                    value_dim, sinks_H),
      (jnp.arange(page_table_BN.shape[1]), page_table_BN.T))
  o_BGR1K, _ = blockwise.online_softmax_finish(carry)
  return o_BGR1K.reshape(batch, num_heads, value_dim).astype(
      v_pages_PpGK.dtype)


def _pallas_paged_attention(q_BHK, k_pages_PpGK, v_pages_PpGK, page_table_BN,
                            lengths_B, *, scale, logit_softcap,
                            pages_per_compute_block):
  q_BHK = q_BHK * jnp.asarray(scale, q_BHK.dtype)
  return paged_attention_kernel.paged_attention(
      q_BHK, jnp.moveaxis(k_pages_PpGK, 2, 0),
      jnp.moveaxis(v_pages_PpGK, 2, 0), lengths_B.astype(jnp.int32),
      page_table_BN.astype(jnp.int32),
      attn_logits_soft_cap=logit_softcap or None,
      pages_per_compute_block=pages_per_compute_block)


def paged_attention(
    q_BHK: jax.Array,
    k_pages_PpGK: jax.Array,
    v_pages_PpGK: jax.Array,
    page_table_BN: jax.Array,
    lengths_B: jax.Array,
    *,
    scale: float,
    window: int | None = None,
    chunk: int | None = None,
    logit_softcap: float = 0.0,
    sinks_H: jax.Array | None = None,
    impl: str = "auto",
    pages_per_compute_block: int = 1,
) -> jax.Array:
  """Each sequence's new query over its pages; see the module docstring.

  Args:
    q_BHK: The query of each sequence (at position lengths_B - 1).
    k_pages_PpGK: Key pages.
    v_pages_PpGK: Value pages.
    page_table_BN: Page ids of each sequence, in position order.
    lengths_B: Tokens in each sequence (>= 1), its query's included.
    scale: Multiplier of the query-key dot products.
    window: A query sees this many keys, itself included; None: no window.
    chunk: A query sees only the keys of its chunk of positions (p // chunk
      equal); None: no chunks.
    logit_softcap: Logits become `c * tanh(logits / c)`; 0 is off.
    sinks_H: Per-query-head sink logit (scaled-logit units); None: none.
    impl: One of `IMPLS`.
    pages_per_compute_block: Pages per block of the "pallas" kernel; divides
      N.

  Returns:
    [B, H, K] in the dtype of `v_pages_PpGK`.

  Raises:
    ValueError: `impl` is unknown or cannot serve the call.
  """
  if impl not in IMPLS:
    raise ValueError(f"Unknown paged attention impl {impl!r}; valid: "
                     f"{IMPLS}.")
  pallas_lacks = [name for name, value in (("window", window),
                                           ("chunk", chunk),
                                           ("sinks_H", sinks_H))
                  if value is not None]
  if jnp.dtype(k_pages_PpGK.dtype) != jnp.bfloat16:
    pallas_lacks.append(f"{jnp.dtype(k_pages_PpGK.dtype).name} pages")
  on_tpu = backend.target_platform() == "tpu"
  if impl == "auto":
    impl = "pallas" if on_tpu and not pallas_lacks else "jax"
  if impl == "pallas" and (pallas_lacks or not on_tpu):
    raise ValueError(
        "Paged attention impl 'pallas' runs on TPU with bfloat16 pages and "
        "without window, chunk or sinks "
        f"(platform {backend.target_platform()!r}, given {pallas_lacks}); "
        "use 'auto', 'jax' or 'reference'.")
  if impl == "pallas":
    return _pallas_paged_attention(
        q_BHK, k_pages_PpGK, v_pages_PpGK, page_table_BN, lengths_B,
        scale=scale, logit_softcap=logit_softcap,
        pages_per_compute_block=pages_per_compute_block)
  fn = (reference_paged_attention if impl == "reference" else
        _jax_paged_attention)
  return fn(q_BHK, k_pages_PpGK, v_pages_PpGK, page_table_BN, lengths_B,
            scale=scale, window=window, chunk=chunk,
            logit_softcap=logit_softcap,
            sinks_H=sinks_H)
