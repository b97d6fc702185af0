"""Multi-head self-attention layer with GQA, optional q/k norm and rotary.

A layer attends causally, within a sliding window or a chunk of positions
when it is local (`maxtext.common.layer_pattern`); a layer without rotary
(Llama 4's NoPE layers: `rotary` None) may scale its queries up with the
position (temperature tuning).

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.

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

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from flax import nnx

from maxtext.common import axes
from maxtext.common import sections
from maxtext.kernels import attention as attention_kernels
from maxtext.kernels import dispatch as attention_dispatch
from maxtext.kernels import paged_attention
from maxtext.layers import kv_cache as kv_cache_lib
from maxtext.layers import linear
from maxtext.layers import norm
from maxtext.layers import rope


# "gqa": this module; "mla": multi-head latent attention (DeepSeek,
# `maxtext.layers.mla`).
TYPES = ("gqa", "mla")
QK_NORM_SPANS = ("head", "projection")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionConfig:
  """A model's self-attention (`ModelConfig.attention`).

  Attributes (their `model` section keys in `KEYS`):
    type: "gqa" (this module) or "mla" (`maxtext.layers.mla`, whose
      `head_dim` is the width of the decoupled rotary part of each query and
      key head and whose `num_kv_heads` equals `num_heads`).
    num_heads: Query heads.
    num_kv_heads: Key/value heads; divides `num_heads` (GQA, MQA when 1).
    head_dim: Width of one attention head.
    qk_norm: RMSNorm of queries and keys before rotary.
    qk_norm_over: What one q/k norm's root mean square spans: "head" (each
      head's `head_dim`: Qwen 3, Gemma 3) or "projection" (all heads of the
      projection at once, one scale per head and dim: OLMo 2/3).
    qkv_bias: The query, key and value projections add a bias.
    output_bias: The output projection adds a bias (GPT-OSS).
    sinks: Each query head has a learned sink logit that joins its softmax
      denominator (GPT-OSS; `maxtext.kernels.attention`).
    query_pre_attn_scalar: Queries are scaled by its -1/2 power; None: the
      query/key head width's (`query_scale`).
    logit_softcap: Logits become `c * tanh(logits / c)`; 0 is off.
    global_head_dim: Width of a global layer's heads when it differs from
      `head_dim` (Gemma 4); 0: `head_dim`. Such layers are a layer kind of
      their own (`maxtext.common.layer_pattern`).
    global_num_kv_heads: A global layer's key/value heads when they differ
      from `num_kv_heads`; 0: `num_kv_heads`.
    k_eq_v: The layer has no value projection: its values are the key
      projection's output (before the key norm and rotary).
    global_k_eq_v: `k_eq_v` on global layers only (Gemma 4's
      attention_k_eq_v), which then are a layer kind of their own.
    value_norm: Values are divided by their root mean square over each head
      (no scale; `norm_eps`; Gemma 4).
    qk_l2_norm: After rotary, queries and keys are divided by their root
      mean square over each head (no scale; `norm_eps`); layers without
      rotary skip it (Llama 4's use_qk_norm).
    output_gate: The attention's output is multiplied by the sigmoid of a
      gate projection of the layer's input [D] -> [H, K], per head and
      dimension, before the output projection (Qwen3-Next, Qwen3.5).
    temperature_scale, temperature_floor_scale: The queries of a layer
      without rotary are multiplied by `1 + temperature_scale *
      log(1 + floor((p + 1) / temperature_floor_scale))` at position p
      (Llama 4's attention temperature tuning); 0 is off.
  """

  KEYS: ClassVar[dict[str, str]] = {
      "type": "attention_type", "num_heads": "num_heads",
      "num_kv_heads": "num_kv_heads", "head_dim": "head_dim",
      "qk_norm": "qk_norm", "qk_norm_over": "qk_norm_over",
      "qkv_bias": "qkv_bias",
      "output_bias": "attention_output_bias", "sinks": "attention_sinks",
      "query_pre_attn_scalar": "query_pre_attn_scalar",
      "logit_softcap": "attn_logit_softcap",
      "global_head_dim": "global_head_dim",
      "global_num_kv_heads": "global_num_kv_heads",
      "k_eq_v": "attention_k_eq_v",
      "global_k_eq_v": "attention_global_k_eq_v",
      "value_norm": "attention_value_norm",
      "qk_l2_norm": "qk_l2_norm",
      "output_gate": "attention_output_gate",
      "temperature_scale": "attn_temperature_scale",
      "temperature_floor_scale": "attn_temperature_floor_scale",
  }

  type: str = "gqa"
  num_heads: int
  num_kv_heads: int
  head_dim: int
  qk_norm: bool = False
  qk_norm_over: str = "head"
  qkv_bias: bool = False
  output_bias: bool = False
  sinks: bool = False
  query_pre_attn_scalar: float | None = None
  logit_softcap: float = 0.0
  global_head_dim: int = 0
  global_num_kv_heads: int = 0
  k_eq_v: bool = False
  global_k_eq_v: bool = False
  value_norm: bool = False
  qk_l2_norm: bool = False
  output_gate: bool = False
  temperature_scale: float = 0.0
  temperature_floor_scale: int = 8192

  def __post_init__(self):
    def fail(field, valid):
      sections.fail_part(self, field, valid)

    if self.type not in TYPES:
      fail("type", f"valid values are {TYPES}")
    for name in ("num_heads", "num_kv_heads", "head_dim"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        fail(name, "must be a positive integer")
    if self.num_heads % self.num_kv_heads:
      fail("num_kv_heads", f"must divide num_heads={self.num_heads}")
    if self.head_dim % 2:
      fail("head_dim", "must be even (rotary embeddings)")
    for name in ("qk_norm", "qkv_bias", "output_bias", "sinks",
                 "qk_l2_norm", "k_eq_v", "global_k_eq_v", "value_norm",
                 "output_gate"):
      if not isinstance(getattr(self, name), bool):
        fail(name, "must be True or False")
    if self.qk_norm_over not in QK_NORM_SPANS:
      fail("qk_norm_over", f"valid values are {QK_NORM_SPANS}")
    scalar = self.query_pre_attn_scalar
    if scalar is not None and scalar <= 0:
      fail("query_pre_attn_scalar",
           "must be positive or None (None means head_dim)")
    if self.logit_softcap < 0:
      fail("logit_softcap", "must be >= 0 (0 turns it off)")
    if self.temperature_scale < 0:
      fail("temperature_scale", "must be >= 0 (0 turns it off)")
    floor = self.temperature_floor_scale
    if isinstance(floor, bool) or not isinstance(floor, int) or floor < 1:
      fail("temperature_floor_scale", "must be a positive integer")
    for name in ("global_head_dim", "global_num_kv_heads"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        fail(name, "must be an integer >= 0 (0: the model's)")
    if self.global_head_dim % 2:
      fail("global_head_dim", "must be even (rotary embeddings)")
    if self.global_num_kv_heads and self.num_heads % self.global_num_kv_heads:
      fail("global_num_kv_heads", f"must divide num_heads={self.num_heads}")
    name = self.global_sizes_key()
    if name and self.type != "gqa":
      fail(name, f'serves attention_type="gqa" only, not {self.type!r};'
           " use 0")

  def global_sizes_key(self) -> str | None:
    """The field setting global layers' attention apart, if any is set."""
    return ("global_head_dim" if self.global_head_dim else
            "global_num_kv_heads" if self.global_num_kv_heads else
            "global_k_eq_v" if self.global_k_eq_v else None)

  def global_sizes(self) -> "AttentionConfig":
    """The attention of a global layer: its own sizes (and `k_eq_v`) in
    place of these."""
    return dataclasses.replace(
        self, head_dim=self.global_head_dim or self.head_dim,
        num_kv_heads=self.global_num_kv_heads or self.num_kv_heads,
        k_eq_v=self.k_eq_v or self.global_k_eq_v,
        global_head_dim=0, global_num_kv_heads=0, global_k_eq_v=False)

  def temperature(self, positions_BL: jax.Array) -> jax.Array:
    """Multiplier [B, L, 1, 1] (float32) of the queries of a layer without
    rotary at `positions_BL` (temperature tuning)."""
    steps_BL = jnp.floor((positions_BL.astype(jnp.float32) + 1.0) /
                         self.temperature_floor_scale)
    return (jnp.log1p(steps_BL) * self.temperature_scale + 1.0)[..., None,
                                                                 None]

  def query_scale(self, qk_head_dim: int) -> float:
    """Multiplier of the queries before their dot product with keys of
    width `qk_head_dim`: `query_pre_attn_scalar` (or that width) ** -0.5."""
    return (self.query_pre_attn_scalar or qk_head_dim)**-0.5


class Attention(nnx.Module):
  """q/k/v projections (values: the keys' projection with `cfg.k_eq_v`;
  then their weightless norm with `cfg.value_norm`) -> (q/k norm) -> rotary
  (then q/k L2 norm) or temperature -> causal attention -> output.

  With `cfg.qkv_bias` the q/k/v projections add a bias, with
  `cfg.output_bias` the output projection; with `cfg.sinks` each query
  head has a learned sink logit `sinks` [H] (float32 in the kernel)
  joining its softmax denominator, in training and decoding alike.

  With `cfg.output_gate` the attention's output times sigmoid(`gate`(x))
  goes to the output projection.

  With `kv_shared` (a layer kind that shares keys and values:
  `maxtext.common.layer_pattern`) the layer has no key and value
  projections (nor key norm) and attends over another layer's.
  """

  def __init__(self, cfg: AttentionConfig, *, embed_dim: int,
               norm_config: norm.NormConfig, dtype: str, param_dtype: str,
               kernel: attention_dispatch.Kernel = attention_dispatch.Kernel(),
               rngs: nnx.Rngs, kv_shared: bool = False):
    def project(in_shape, out_shape, in_axes, out_axes, use_bias=False):
      return linear.Linear(in_shape, out_shape, in_axes=in_axes,
                           out_axes=out_axes, dtype=dtype,
                           param_dtype=param_dtype, rngs=rngs,
                           use_bias=use_bias)

    heads = (cfg.num_heads, cfg.head_dim)
    kv_heads = (cfg.num_kv_heads, cfg.head_dim)
    self.query = project((embed_dim,), heads, (axes.EMBED,),
                         (axes.HEADS, axes.HEAD_DIM), cfg.qkv_bias)
    self.key = (None if kv_shared else
                project((embed_dim,), kv_heads, (axes.EMBED,),
                        (axes.KV_HEADS, axes.HEAD_DIM), cfg.qkv_bias))
    self.value = (None if cfg.k_eq_v or kv_shared else
                  project((embed_dim,), kv_heads, (axes.EMBED,),
                          (axes.KV_HEADS, axes.HEAD_DIM), cfg.qkv_bias))
    self.output = project(heads, (embed_dim,), (axes.HEADS, axes.HEAD_DIM),
                          (axes.EMBED,), cfg.output_bias)
    self.gate = (project((embed_dim,), heads, (axes.EMBED,),
                         (axes.HEADS, axes.HEAD_DIM))
                 if cfg.output_gate else None)
    self.sinks = (axes.param(jnp.zeros((cfg.num_heads,),
                                       jnp.dtype(param_dtype)),
                             (axes.HEADS,))
                  if cfg.sinks else None)
    if cfg.qk_norm:
      def qk_norm(heads, heads_axis):
        if cfg.qk_norm_over == "projection":
          return norm_config.rms_norm((heads, cfg.head_dim),
                                      axis_name=(heads_axis, axes.HEAD_DIM),
                                      param_dtype=param_dtype)
        return norm_config.rms_norm(cfg.head_dim, axis_name=axes.HEAD_DIM,
                                    param_dtype=param_dtype)

      self.query_norm = qk_norm(cfg.num_heads, axes.HEADS)
      self.key_norm = (None if kv_shared else
                       qk_norm(cfg.num_kv_heads, axes.KV_HEADS))
    else:
      self.query_norm = self.key_norm = None
    self.kernel = kernel
    self.scale = cfg.query_scale(cfg.head_dim)
    self.logit_softcap = cfg.logit_softcap
    self.l2_norm_eps = norm_config.eps if cfg.qk_l2_norm else None
    self.value_norm_eps = norm_config.eps if cfg.value_norm else None
    self.temperature_config = cfg if cfg.temperature_scale else None

  def __call__(
      self,
      x_BLD: jax.Array,
      rotary: rope.Rotary | None,
      *,
      window: int | None = None,
      chunk: int | None = None,
      segment_ids_BL: jax.Array | None = None,
      cache: kv_cache_lib.KVCache | kv_cache_lib.PagedView | None = None,
      positions_BL: jax.Array | None = None,
      kv: tuple[jax.Array, jax.Array] | None = None,
      image_blocks_BL: jax.Array | None = None,
  ) -> jax.Array | tuple[jax.Array, kv_cache_lib.KVCache |
                         kv_cache_lib.PagedView]:
    """Attends causally; `window` limits how far back a query looks, `chunk`
    to the keys of its chunk of positions; `rotary` None: no rotary.

    The tokens are at `positions_BL` (None: 0..L-1 in every row, not with
    a cache). With `cache`, the tokens (consecutive in each row) are written
    to the cache and attend over it; returns (output, cache). Packed
    sequences (`segment_ids_BL`) are not supported with a cache.

    Without a cache, `kv` is these tokens' (keys, values) from
    `keys_values` (of this layer, or of the layer whose keys and values a
    `kv_shared` layer reads; None: computed here). A `kv_shared` layer
    reads `cache` (that layer's, already written) and writes nothing.

    `image_blocks_BL` (`maxtext.layers.vision.image_blocks`): tokens with
    the same id >= 0 also attend to each other, later ones included (an
    image's soft tokens), whatever the window; the kernel then takes an
    explicit mask.
    """
    if cache is None and positions_BL is None:
      positions_BL = jnp.broadcast_to(jnp.arange(x_BLD.shape[1]),
                                      x_BLD.shape[:2])
    q_names = (axes.BATCH, axes.LENGTH, axes.HEADS, axes.HEAD_DIM)
    q_BLHK = checkpoint_name(self.query(x_BLD), "query_proj")
    if self.query_norm is not None:
      q_BLHK = self.query_norm(q_BLHK)
    if rotary is not None:
      q_BLHK = rotary.apply(q_BLHK)
      if self.l2_norm_eps is not None:
        q_BLHK = norm.normalize(q_BLHK, self.l2_norm_eps).astype(q_BLHK.dtype)
    elif self.temperature_config is not None:
      q_BLHK = (q_BLHK * self.temperature_config.temperature(
          positions_BL)).astype(q_BLHK.dtype)
    q_BLHK = axes.constrain(q_BLHK, q_names)
    shared = self.key is None
    if shared and (kv is None) == (cache is None):
      raise ValueError("A layer that shares keys and values needs exactly "
                       "one of kv= (no cache) and cache= (another layer's).")
    if kv is None and not shared:
      kv = self.keys_values(x_BLD, rotary, ring=cache is None)
    sinks_H = (None if self.sinks is None
               else self.sinks[...].astype(jnp.float32))
    if cache is None:
      k_BLGK, v_BLGK = kv
      if chunk is not None:
        segment_ids_BL = attention_kernels.chunk_segment_ids(
            positions_BL, chunk, segment_ids_BL)
      masks = dict(window=window, segment_ids_BL=segment_ids_BL)
      if image_blocks_BL is not None:
        masks = dict(mask_BLS=attention_kernels.with_blocks(
            attention_kernels.attention_mask(x_BLD.shape[1], window,
                                             segment_ids_BL),
            image_blocks_BL, image_blocks_BL))
      o_BLHK = self.kernel(q_BLHK, k_BLGK, v_BLGK, scale=self.scale,
                           logit_softcap=self.logit_softcap, sinks_H=sinks_H,
                           **masks)
    else:
      kv_cache_lib.check_decode_args(segment_ids_BL, positions_BL)
      if not shared:
        cache = cache.write(*kv, positions_BL[:, 0])
      o_BLHK = self._attend_cache(q_BLHK, cache, positions_BL, window, chunk,
                                  sinks_H, image_blocks_BL)
    o_BLHK = checkpoint_name(axes.constrain(o_BLHK, q_names),
                             "attention_context")
    if self.gate is not None:
      o_BLHK = (o_BLHK * jax.nn.sigmoid(
          self.gate(x_BLD).astype(jnp.float32))).astype(o_BLHK.dtype)
    out_BLD = checkpoint_name(self.output(o_BLHK), "out_proj")
    return out_BLD if cache is None else (out_BLD, cache)

  def keys_values(self, x_BLD: jax.Array, rotary: rope.Rotary | None, *,
                  ring: bool = True) -> tuple[jax.Array, jax.Array]:
    """The keys and values [B, L, G, K] of `x_BLD`: projected (values: the
    keys' projection with `cfg.k_eq_v`, then normalised with
    `cfg.value_norm`), keys normalised and rotated (then L2-normalised).

    `ring`: ring attention (training) keeps them split along the length
    like the queries; otherwise (decoding) they are gathered whole.
    """
    ring = ring and self.kernel.context_parallel == "ring"
    kv_names = (axes.BATCH, axes.LENGTH if ring else axes.KV_LENGTH,
                axes.KV_HEADS, axes.HEAD_DIM)
    k_BLGK = checkpoint_name(self.key(x_BLD), "key_proj")
    v_BLGK = (k_BLGK if self.value is None else
              checkpoint_name(self.value(x_BLD), "value_proj"))
    if self.value_norm_eps is not None:
      v_BLGK = norm.normalize(v_BLGK, self.value_norm_eps).astype(
          v_BLGK.dtype)
    if self.key_norm is not None:
      k_BLGK = self.key_norm(k_BLGK)
    if rotary is not None:
      k_BLGK = rotary.apply(k_BLGK)
      if self.l2_norm_eps is not None:
        k_BLGK = norm.normalize(k_BLGK, self.l2_norm_eps).astype(k_BLGK.dtype)
    return (axes.constrain(k_BLGK, kv_names),
            axes.constrain(v_BLGK, kv_names))

  def _attend_cache(self, q_BLHK, cache, positions_BL, window, chunk,
                    sinks_H, image_blocks_BL=None):
    """The queries at `positions_BL` over the (already written) cache.

    One query per row over a `PagedView` reads the pages in place
    (`paged_attention`); otherwise the model's kernel runs over the dense
    cache (a paged one gathered) with a causal, windowed or chunked mask by
    position, and with `image_blocks_BL` bidirectional among the tokens of
    one block that this call writes.
    """
    paged = isinstance(cache, kv_cache_lib.PagedView)
    if paged and q_BLHK.shape[1] == 1 and image_blocks_BL is None:
      pages = cache.pages
      o_BHK = paged_attention.paged_attention(
          q_BLHK[:, 0], pages.key_pages_PpGK, pages.value_pages_PpGK,
          cache.page_table_BN, positions_BL[:, 0] + 1, scale=self.scale,
          window=window, chunk=chunk, logit_softcap=self.logit_softcap, sinks_H=sinks_H,
          impl=pages.impl)
      return o_BHK[:, None]
    k_BSGK, v_BSGK = (cache.gather() if paged
                      else (cache.key_BSGK, cache.value_BSGK))
    mask_BLS = attention_kernels.positions_mask(positions_BL, cache.length,
                                                window, chunk)
    if image_blocks_BL is not None:
      rows_B1 = jnp.arange(positions_BL.shape[0])[:, None]
      kv_blocks_BS = jnp.full((positions_BL.shape[0], cache.length), -1,
                              image_blocks_BL.dtype)
      kv_blocks_BS = kv_blocks_BS.at[rows_B1, positions_BL].set(
          image_blocks_BL, mode="drop")
      mask_BLS = attention_kernels.with_blocks(mask_BLS, image_blocks_BL,
                                               kv_blocks_BS)
    return self.kernel(q_BLHK, k_BSGK, v_BSGK, scale=self.scale,
                       logit_softcap=self.logit_softcap, mask_BLS=mask_BLS,
                       sinks_H=sinks_H)
