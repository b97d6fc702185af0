"""Multi-head self-attention layer with GQA, optional q/k norm and rotary.

Shape key: B batch, L length, D embed dim, H query heads, G key/value heads,
K head dim.

Activations carry logical sharding constraints (`axes.constrain`) and remat
names (`jax.ad_checkpoint.checkpoint_name`): "query_proj", "key_proj",
"value_proj" (projections), "attention_context" (kernel output) and
"out_proj" (output projection); `maxtext.layers.remat` policies save or
recompute them by name.

Decoding passes a `KVCache` and the tokens' positions: the new keys and
values are written at those positions and the queries attend over the cache
(same projections, rotary and kernel as training). With a `PagedView` (a
layer's `PagedKVCache` read through the decoder's page table), one-token
decode steps run `maxtext.kernels.paged_attention` over the pages (its
`impl` is the cache's).
"""

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from flax import nnx

from maxtext.common import axes
from maxtext.common.model_config import ModelConfig
from maxtext.kernels import attention as attention_kernels
from maxtext.kernels import dispatch as attention_dispatch
from maxtext.kernels import paged_attention
from maxtext.layers import kv_cache as kv_cache_lib
from maxtext.layers import linear
from maxtext.layers import norm
from maxtext.layers import rope


class Attention(nnx.Module):
  """q/k/v projections -> (q/k norm) -> rotary -> causal attention -> output.

  With `cfg.qkv_bias` the q/k/v projections add a bias, with
  `cfg.attention_output_bias` the output projection; with
  `cfg.attention_sinks` each query head has a learned sink logit `sinks`
  [H] (float32 in the kernel) joining its softmax denominator, in training
  and decoding alike.
  """

  def __init__(self, cfg: ModelConfig, *,
               kernel: attention_dispatch.Kernel = attention_dispatch.Kernel(),
               rngs: nnx.Rngs):
    def project(in_shape, out_shape, in_axes, out_axes, use_bias=False):
      return linear.Linear(in_shape, out_shape, in_axes=in_axes,
                           out_axes=out_axes, dtype=cfg.dtype,
                           param_dtype=cfg.param_dtype, rngs=rngs,
                           use_bias=use_bias)

    heads = (cfg.num_heads, cfg.head_dim)
    kv_heads = (cfg.num_kv_heads, cfg.head_dim)
    self.query = project((cfg.embed_dim,), heads, (axes.EMBED,),
                         (axes.HEADS, axes.HEAD_DIM), cfg.qkv_bias)
    self.key = project((cfg.embed_dim,), kv_heads, (axes.EMBED,),
                       (axes.KV_HEADS, axes.HEAD_DIM), cfg.qkv_bias)
    self.value = project((cfg.embed_dim,), kv_heads, (axes.EMBED,),
                         (axes.KV_HEADS, axes.HEAD_DIM), cfg.qkv_bias)
    self.output = project(heads, (cfg.embed_dim,), (axes.HEADS, axes.HEAD_DIM),
                          (axes.EMBED,), cfg.attention_output_bias)
    self.sinks = (axes.param(jnp.zeros((cfg.num_heads,),
                                       jnp.dtype(cfg.param_dtype)),
                             (axes.HEADS,))
                  if cfg.attention_sinks else None)
    if cfg.qk_norm:
      def head_norm():
        return norm.RMSNorm(cfg.head_dim, axis_name=axes.HEAD_DIM,
                            eps=cfg.norm_eps, offset=cfg.norm_offset,
                            param_dtype=cfg.param_dtype)

      self.query_norm = head_norm()
      self.key_norm = head_norm()
    else:
      self.query_norm = self.key_norm = None
    self.kernel = kernel
    self.scale = cfg.query_scale
    self.logit_softcap = cfg.attn_logit_softcap

  def __call__(
      self,
      x_BLD: jax.Array,
      rotary: rope.Rotary,
      *,
      window: int | None = None,
      segment_ids_BL: jax.Array | None = None,
      cache: kv_cache_lib.KVCache | kv_cache_lib.PagedView | None = None,
      positions_BL: jax.Array | None = None,
  ) -> jax.Array | tuple[jax.Array, kv_cache_lib.KVCache |
                         kv_cache_lib.PagedView]:
    """Attends causally; `window` limits how far back a query looks.

    With `cache`, the tokens (at `positions_BL`, consecutive in each row)
    are written to the cache and attend over it; returns (output, cache).
    Packed sequences (`segment_ids_BL`) are not supported with a cache.
    """
    q_names = (axes.BATCH, axes.LENGTH, axes.HEADS, axes.HEAD_DIM)
    # Ring attention (training) keeps keys and values split along the
    # length like the queries; otherwise they are gathered whole.
    ring = cache is None and self.kernel.context_parallel == "ring"
    kv_names = (axes.BATCH, axes.LENGTH if ring else axes.KV_LENGTH,
                axes.KV_HEADS, axes.HEAD_DIM)
    q_BLHK = checkpoint_name(self.query(x_BLD), "query_proj")
    k_BLGK = checkpoint_name(self.key(x_BLD), "key_proj")
    v_BLGK = checkpoint_name(self.value(x_BLD), "value_proj")
    if self.query_norm is not None:
      q_BLHK = self.query_norm(q_BLHK)
      k_BLGK = self.key_norm(k_BLGK)
    q_BLHK = axes.constrain(rotary.apply(q_BLHK), q_names)
    k_BLGK = axes.constrain(rotary.apply(k_BLGK), kv_names)
    v_BLGK = axes.constrain(v_BLGK, kv_names)
    sinks_H = (None if self.sinks is None
               else self.sinks[...].astype(jnp.float32))
    if cache is None:
      o_BLHK = self.kernel(q_BLHK, k_BLGK, v_BLGK,
                           scale=self.scale, window=window,
                           segment_ids_BL=segment_ids_BL,
                           logit_softcap=self.logit_softcap, sinks_H=sinks_H)
    else:
      kv_cache_lib.check_decode_args(segment_ids_BL, positions_BL)
      cache = cache.write(k_BLGK, v_BLGK, positions_BL[:, 0])
      o_BLHK = self._attend_cache(q_BLHK, cache, positions_BL, window,
                                  sinks_H)
    o_BLHK = checkpoint_name(axes.constrain(o_BLHK, q_names),
                             "attention_context")
    out_BLD = checkpoint_name(self.output(o_BLHK), "out_proj")
    return out_BLD if cache is None else (out_BLD, cache)

  def _attend_cache(self, q_BLHK, cache, positions_BL, window, sinks_H):
    """The queries at `positions_BL` over the (already written) cache.

    One query per row over a `PagedView` reads the pages in place
    (`paged_attention`); otherwise the model's kernel runs over the dense
    cache (a paged one gathered) with a causal, windowed mask by position.
    """
    paged = isinstance(cache, kv_cache_lib.PagedView)
    if paged and q_BLHK.shape[1] == 1:
      pages = cache.pages
      o_BHK = paged_attention.paged_attention(
          q_BLHK[:, 0], pages.key_pages_PTGK, pages.value_pages_PTGK,
          cache.page_table_BN, positions_BL[:, 0] + 1, scale=self.scale,
          window=window, logit_softcap=self.logit_softcap, sinks_H=sinks_H,
          impl=pages.impl)
      return o_BHK[:, None]
    k_BSGK, v_BSGK = (cache.gather() if paged
                      else (cache.key_BSGK, cache.value_BSGK))
    mask_BLS = attention_kernels.positions_mask(positions_BL, cache.length,
                                                window)
    return self.kernel(q_BLHK, k_BSGK, v_BSGK, scale=self.scale,
                       logit_softcap=self.logit_softcap, mask_BLS=mask_BLS,
                       sinks_H=sinks_H)
