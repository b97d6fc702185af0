"""Multi-head latent attention (MLA, DeepSeek-V2/V3).

Queries: x -> q_a (rank `q_lora_rank`) -> RMSNorm -> q_b, per head a
non-rotary part (width O = `qk_nope_head_dim`) and a rotary part (width
K = `head_dim`); with `q_lora_rank` 0 one projection x -> q. Keys and values
come from a compressed latent: x -> kv_a gives a latent (width Z =
`kv_lora_rank`) and one rotary key shared by all heads (width K); the latent
is RMS-normalised and kv_b expands it into every head's non-rotary key (O)
and value (width U = `v_head_dim`). The rotary parts are rotated by position
(decoupled RoPE, with YaRN scaling when configured); a head's key is
[non-rotary key, shared rotary key]. The softmax scale is
(O + K)**-0.5, times `yarn_mscale(factor, mscale_all_dim)**2` with YaRN
(as in DeepSeek-V3 and transformers' DeepseekV3Attention).

With `rope_interleave` (DeepSeek's checkpoints) the rotary part pairs
dimensions (0, 1), (2, 3), ...: it is de-interleaved (evens, then odds) and
rotated in the half-split layout of `maxtext.layers.rope`, which is exactly
transformers' `apply_rotary_pos_emb_interleave` (whose output is in that
layout too). Queries and keys get the same permutation, so the logits are
those of the interleaved rotation.

The KV cache (`empty_cache`) stores per token only the normalised latent
and the rotated shared key, a `KVCache` whose "keys" are the latents
[B, S, 1, Z] and "values" the rotary keys [B, S, 1, K]; decoding expands the
cached latents with kv_b, so it computes the same function as the uncached
forward pass (the weight-absorbed decoding of DeepSeek's inference code,
which skips that expansion, is not implemented). A paged cache
(`kv_cache.PagedView`) holds the same entries in pages: each call reads
its rows' pages as that dense view (`gather`), attention over latents
having no paged kernel.

With `index_topk` (DeepSeek-V3.2's DeepSeek Sparse Attention) a lightning
indexer picks the tokens each query attends to
(`maxtext.kernels.sparse_attention`): its queries come from the query latent
(`index_query`), one key per token from the input (`index_key`, then a
LayerNorm), per-head weights from the input (`index_weights`, times
I**-0.5); the first `head_dim` dimensions of its queries and keys are
rotated in the half-split layout (not interleaved, as transformers'
DeepseekV32Indexer). Attention over the selected tokens runs in the absorbed
form (the key up-projection folded into the queries, the value
up-projection applied after), so no per-head keys are expanded; the cache
also stores each token's indexer key (after its rotary key in the "values").

The indexer trains as DeepSeek-V3.2 was trained, by `index_stage`: called
with `index_loss=True` (the train step's forward pass) the layer also
returns the mean over its real queries (segment id not 0) of the KL from
its attention's distribution to the indexer's
(`sparse_attention.indexer_kl`); the indexer reads its inputs detached, so
that loss trains only the indexer, and the language-model loss never
reaches it (the selection is not differentiable). "sparse": attention over
the selected tokens, the KL over them. "warmup" (the dense warm-up): dense
attention (over every allowed token, in the absorbed form), the KL over all
of them, and only the indexer's parameters train (`trainable_params`: the
train step freezes the rest). A model warmed up this way continues in the
same workdir with `index_stage="sparse"` (the optimizer state has the same
structure in both stages).

Remat names (`maxtext.layers.remat`): "query_proj" (queries), "key_proj"
(the kv_a output: latent and rotary key), "attention_context" and
"out_proj", as in `maxtext.layers.attention`.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
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
from maxtext.kernels import sparse_attention
from maxtext.layers import attention
from maxtext.layers import kv_cache as kv_cache_lib
from maxtext.layers import linear
from maxtext.layers import norm
from maxtext.layers import rope

# Logical axes of the low-rank widths (replicated unless a rule names them).
Q_LORA = "q_lora"
KV_LORA = "kv_lora"
INDEX_HEADS = "index_heads"
INDEX_STAGES = ("sparse", "warmup")
# The indexer's parameters (what the dense warm-up stage trains).
INDEXER_PARAMS = frozenset(("index_query", "index_key", "index_key_norm",
                            "index_weights"))
# DeepSeek's (and transformers') q_a / kv_a norms keep RMSNorm's default eps.
LATENT_NORM_EPS = 1e-6


@dataclasses.dataclass(frozen=True, kw_only=True)
class MlaConfig:
  """The latent sizes of multi-head latent attention (`ModelConfig.mla`,
  read with `AttentionConfig.type` "mla"; module doc).

  Attributes (their `model` section keys in `KEYS`):
    q_lora_rank: Rank of the low-rank query projection (Q); 0: one full
      query projection.
    kv_lora_rank: Width of the compressed key/value latent (Z): what the KV
      cache stores per token, with the rotary key.
    qk_nope_head_dim: Width of the non-rotary part of each query and key
      head (O).
    v_head_dim: Width of each value head (U).
    rope_interleave: The rotary part pairs dimensions (0, 1), (2, 3), ...
      (DeepSeek's checkpoints) instead of (k, k + K/2).
    index_topk: DeepSeek Sparse Attention (DeepSeek-V3.2): each query
      attends only to the `index_topk` tokens its lightning indexer scores
      highest (`maxtext.kernels.sparse_attention`); 0: dense MLA.
    index_num_heads: The indexer's heads (I).
    index_head_dim: Their width (J), rotary on its first `head_dim`.
    index_stage: How the indexer trains (module doc): "sparse" (sparse
      attention; the default, and how the released models run) or
      "warmup" (dense attention, only the indexer trains).
  """

  KEYS: ClassVar[dict[str, str]] = {
      "q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank",
      "qk_nope_head_dim": "qk_nope_head_dim", "v_head_dim": "v_head_dim",
      "rope_interleave": "rope_interleave", "index_topk": "index_topk",
      "index_num_heads": "index_num_heads",
      "index_head_dim": "index_head_dim", "index_stage": "index_stage",
  }
  SIZES: ClassVar[tuple[str, ...]] = ("q_lora_rank", "kv_lora_rank",
                                      "qk_nope_head_dim", "v_head_dim",
                                      "index_topk", "index_num_heads",
                                      "index_head_dim")

  q_lora_rank: int = 0
  kv_lora_rank: int = 0
  qk_nope_head_dim: int = 0
  v_head_dim: int = 0
  rope_interleave: bool = False
  index_topk: int = 0
  index_num_heads: int = 0
  index_head_dim: int = 0
  index_stage: str = "sparse"

  def __post_init__(self):
    for name in self.SIZES:
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        sections.fail_part(self, name, "must be an integer >= 0")
    if not isinstance(self.rope_interleave, bool):
      sections.fail_part(self, "rope_interleave", "must be True or False")
    if self.index_stage not in INDEX_STAGES:
      sections.fail_part(self, "index_stage", f"must be one of {INDEX_STAGES}")

  def check_used(self) -> None:
    """Refuses sizes for a model whose attention is not MLA."""
    for name in self.SIZES + ("rope_interleave",):
      if getattr(self, name):
        sections.fail_part(self, name, 'only attention_type="mla" reads it;'
                           " leave it at its default")
    if self.index_stage != "sparse":
      sections.fail_part(self, "index_stage", 'only attention_type="mla"'
                         " reads it; leave it at its default")

  def check_sizes(self, rope_dim: int) -> None:
    """The sizes MLA needs are set (`rope_dim`: the rotary part's width),
    and DeepSeek Sparse Attention's with `index_topk`."""
    for name in ("kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
      if getattr(self, name) < 1:
        sections.fail_part(self, name,
                           'must be positive with attention_type="mla"')
    if not self.index_topk:
      for name in ("index_num_heads", "index_head_dim"):
        if getattr(self, name):
          sections.fail_part(self, name, "only index_topk > 0 (DeepSeek"
                             " Sparse Attention) reads it; leave it at 0")
      if self.index_stage != "sparse":
        sections.fail_part(self, "index_stage", "only index_topk > 0 (DeepSeek"
                           " Sparse Attention) has an indexer to train")
      return
    if self.q_lora_rank < 1:
      sections.fail_part(self, "q_lora_rank", "must be positive with"
                         " index_topk (the indexer reads the query latent)")
    if self.index_num_heads < 1:
      sections.fail_part(self, "index_num_heads",
                         "must be positive with index_topk")
    if self.index_head_dim < rope_dim:
      sections.fail_part(self, "index_head_dim", f"must be at least head_dim"
                         f"={rope_dim} (its rotary part) with index_topk")


def trainable_params(cfg: MlaConfig):
  """Which parameters train: None for all, else a predicate of a
  parameter's path names (the dense warm-up trains the indexer only)."""
  if cfg.index_stage == "warmup":
    return lambda names: not INDEXER_PARAMS.isdisjoint(names)
  return None


def softmax_scale(attention_cfg: attention.AttentionConfig, cfg: MlaConfig,
                  rope_cfg: rope.RopeConfig) -> float:
  """(qk_nope_head_dim + head_dim)**-0.5, times YaRN's mscale**2 when the
  yarn scaling sets `rope_yarn_mscale_all_dim`."""
  scale = attention_cfg.query_scale(cfg.qk_nope_head_dim +
                                    attention_cfg.head_dim)
  if rope_cfg.scaling == "yarn" and rope_cfg.yarn_mscale_all_dim:
    scale *= rope.yarn_mscale(rope_cfg.scaling_factor,
                              rope_cfg.yarn_mscale_all_dim)**2
  return scale


def empty_cache(cfg: MlaConfig, head_dim: int, dtype: str, batch: int,
                length: int) -> kv_cache_lib.KVCache:
  """A zero latent cache: latents [B, S, 1, Z] and rotary keys [B, S, 1, K]
  (K = `head_dim`, the rotary part's width), followed by the indexer's keys
  [.., J] with `index_topk`."""
  dtype = jnp.dtype(dtype)
  width = head_dim + (cfg.index_head_dim if cfg.index_topk else 0)
  return kv_cache_lib.KVCache(
      jnp.zeros((batch, length, 1, cfg.kv_lora_rank), dtype),
      jnp.zeros((batch, length, 1, width), dtype))


class MLA(nnx.Module):
  """Latent q/kv projections -> decoupled rotary -> attention -> output.

  Same call signature as `maxtext.layers.attention.Attention`.
  """

  def __init__(self, attention_cfg: attention.AttentionConfig,
               cfg: MlaConfig, rope_cfg: rope.RopeConfig, *, embed_dim: int,
               dtype: str, param_dtype: str,
               kernel: attention_dispatch.Kernel = attention_dispatch.Kernel(),
               rngs: nnx.Rngs):
    def project(in_shape, out_shape, in_axes, out_axes):
      return linear.Linear(in_shape, out_shape, in_axes=in_axes,
                           out_axes=out_axes, dtype=dtype,
                           param_dtype=param_dtype, rngs=rngs)

    def latent_norm(dim, axis_name):
      return norm.RMSNorm(dim, axis_name=axis_name, eps=LATENT_NORM_EPS,
                          offset=0.0, param_dtype=param_dtype)

    heads = attention_cfg.num_heads
    rope_dim = attention_cfg.head_dim
    qk_dim = cfg.qk_nope_head_dim + rope_dim
    head_axes = (axes.HEADS, axes.HEAD_DIM)
    if cfg.q_lora_rank:
      self.query = None
      self.query_down = project((embed_dim,), (cfg.q_lora_rank,),
                                (axes.EMBED,), (Q_LORA,))
      self.query_norm = latent_norm(cfg.q_lora_rank, Q_LORA)
      self.query_up = project((cfg.q_lora_rank,), (heads, qk_dim), (Q_LORA,),
                              head_axes)
    else:
      self.query = project((embed_dim,), (heads, qk_dim), (axes.EMBED,),
                           head_axes)
      self.query_down = self.query_norm = self.query_up = None
    self.kv_down = project((embed_dim,), (cfg.kv_lora_rank + rope_dim,),
                           (axes.EMBED,), (KV_LORA,))
    self.kv_norm = latent_norm(cfg.kv_lora_rank, KV_LORA)
    self.kv_up = project((cfg.kv_lora_rank,),
                         (heads, cfg.qk_nope_head_dim + cfg.v_head_dim),
                         (KV_LORA,), head_axes)
    self.output = project((heads, cfg.v_head_dim), (embed_dim,),
                          head_axes, (axes.EMBED,))
    if cfg.index_topk:
      self.index_query = project((cfg.q_lora_rank,), (
          cfg.index_num_heads, cfg.index_head_dim), (Q_LORA,),
                                 (INDEX_HEADS, axes.HEAD_DIM))
      self.index_key = project((embed_dim,), (cfg.index_head_dim,),
                               (axes.EMBED,), (axes.HEAD_DIM,))
      self.index_key_norm = norm.LayerNorm(
          cfg.index_head_dim, axis_name=axes.HEAD_DIM, eps=LATENT_NORM_EPS,
          param_dtype=param_dtype)
      self.index_weights = project((embed_dim,), (cfg.index_num_heads,),
                                   (axes.EMBED,), (INDEX_HEADS,))
    else:
      self.index_query = self.index_key = self.index_key_norm = None
      self.index_weights = None
    self.index_topk = cfg.index_topk
    self.index_stage = cfg.index_stage
    self.kernel = kernel
    self.scale = softmax_scale(attention_cfg, cfg, rope_cfg)
    self.logit_softcap = attention_cfg.logit_softcap
    self.interleaved = cfg.rope_interleave
    self.nope_dim = cfg.qk_nope_head_dim
    self.latent_dim = cfg.kv_lora_rank

  def _rotate(self, rotary: rope.Rotary, x_BLHK: jax.Array) -> jax.Array:
    if self.interleaved:
      x_BLHK = jnp.concatenate([x_BLHK[..., 0::2], x_BLHK[..., 1::2]],
                               axis=-1)
    return rotary.apply(x_BLHK)

  def _keys_values(self, latent_BSZ, k_rope_BS1K):
    """Per-head keys [B, S, H, O + K] and values [B, S, H, U] of latents."""
    kv_BSHx = self.kv_up(latent_BSZ)
    k_nope_BSHO = kv_BSHx[..., :self.nope_dim]
    v_BSHU = kv_BSHx[..., self.nope_dim:]
    k_rope_BSHK = jnp.broadcast_to(
        k_rope_BS1K, (*k_nope_BSHO.shape[:-1], k_rope_BS1K.shape[-1]))
    return (jnp.concatenate([k_nope_BSHO, k_rope_BSHK.astype(
        k_nope_BSHO.dtype)], axis=-1), v_BSHU)

  def _sparse(self, rotary, x_BLD, q_latent_BLQ, q_BLHx, latent_BLZ,
              k_rope_BL1K, *, segment_ids_BL, cache, positions_BL,
              index_loss):
    """DeepSeek Sparse Attention's output [B, L, H, U], the cache and with
    `index_loss` the indexer's loss, else None (module docstring)."""
    batch, length = x_BLD.shape[:2]
    rope_dim = k_rope_BL1K.shape[-1]
    # The indexer's inputs, detached: its loss trains the indexer only.
    x_BLD, q_latent_BLQ = jax.lax.stop_gradient((x_BLD, q_latent_BLQ))
    iq_BLIJ, ik_BL1J = (
        jnp.concatenate([rotary.apply(x[..., :rope_dim]), x[..., rope_dim:]],
                        axis=-1)
        for x in (self.index_query(q_latent_BLQ),
                  self.index_key_norm(self.index_key(x_BLD))[:, :, None]))
    w_BLI = self.index_weights(x_BLD).astype(jnp.float32) * (
        iq_BLIJ.shape[2]**-0.5)
    if cache is None:
      c_BSZ, r_BSK, ik_BSJ = latent_BLZ, k_rope_BL1K[:, :, 0], ik_BL1J[:, :, 0]
      q_positions_BL = jnp.broadcast_to(jnp.arange(length), (batch, length))
    else:
      kv_cache_lib.check_decode_args(segment_ids_BL, positions_BL)
      cache = cache.write(latent_BLZ[:, :, None], jnp.concatenate(
          [k_rope_BL1K, ik_BL1J.astype(k_rope_BL1K.dtype)], axis=-1),
                          positions_BL[:, 0])
      c_BS1Z, values_BS1x = cache.gather()
      c_BSZ = c_BS1Z[:, :, 0]
      r_BSK = values_BS1x[:, :, 0, :rope_dim]
      ik_BSJ = values_BS1x[:, :, 0, rope_dim:]
      q_positions_BL = positions_BL
    k_positions_BS = jnp.broadcast_to(jnp.arange(c_BSZ.shape[1]),
                                      c_BSZ.shape[:2])
    # The key and value up-projections W_uk [Z, H, O], W_uv [Z, H, U].
    up_ZHx = self.kv_up.kernel[...].astype(jnp.float32)
    qc_BLHZ = jnp.einsum("blho,zho->blhz",
                         q_BLHx[..., :self.nope_dim].astype(jnp.float32),
                         up_ZHx[..., :self.nope_dim])
    out = sparse_attention.sparse_attention(
        qc_BLHZ, q_BLHx[..., self.nope_dim:], c_BSZ, r_BSK, iq_BLIJ, ik_BSJ,
        w_BLI, top_k=self.index_topk, scale=self.scale,
        index_scale=iq_BLIJ.shape[-1]**-0.5, q_positions_BL=q_positions_BL,
        k_positions_BS=k_positions_BS, q_segments_BL=segment_ids_BL,
        k_segments_BS=segment_ids_BL, dense=self.index_stage == "warmup",
        index_loss=index_loss)
    loss = None
    if index_loss:
      out, kl_BL = out
      real_BL = (jnp.ones(kl_BL.shape) if segment_ids_BL is None
                 else (segment_ids_BL != 0).astype(jnp.float32))
      loss = jnp.sum(kl_BL * real_BL) / jnp.maximum(jnp.sum(real_BL), 1.0)
    o_BLHU = jnp.einsum("blhz,zhu->blhu", out, up_ZHx[..., self.nope_dim:])
    return o_BLHU.astype(q_BLHx.dtype), cache, loss

  def __call__(
      self,
      x_BLD: jax.Array,
      rotary: rope.Rotary,
      *,
      window: int | None = None,
      chunk: int | None = None,
      segment_ids_BL: jax.Array | None = None,
      cache: kv_cache_lib.KVCache | None = None,
      positions_BL: jax.Array | None = None,
      index_loss: bool = False,
  ) -> jax.Array | tuple[jax.Array, kv_cache_lib.KVCache | jax.Array]:
    """Attends causally (see `Attention.__call__`); with `cache` (from
    `empty_cache`) the tokens' latents are written at `positions_BL` and
    the tokens attend over every cached position; returns (output, cache).
    With `index_loss` (no cache, an indexer): (output, the indexer's loss
    of the module docstring).
    """
    if window is not None or chunk is not None:
      raise ValueError(f"MLA has no sliding window or chunks (got window="
                       f"{window}, chunk={chunk}).")
    if index_loss and (cache is not None or not self.index_topk):
      raise ValueError("index_loss needs an indexer (index_topk > 0) and no"
                       " cache.")
    q_names = (axes.BATCH, axes.LENGTH, axes.HEADS, axes.HEAD_DIM)
    kv_names = (axes.BATCH, axes.KV_LENGTH, axes.HEADS, axes.HEAD_DIM)
    q_latent_BLQ = None
    if self.query is None:
      q_latent_BLQ = self.query_norm(self.query_down(x_BLD))
      q_BLHx = self.query_up(q_latent_BLQ)
    else:
      q_BLHx = self.query(x_BLD)
    q_BLHx = checkpoint_name(q_BLHx, "query_proj")
    q_BLHx = jnp.concatenate(
        [q_BLHx[..., :self.nope_dim],
         self._rotate(rotary, q_BLHx[..., self.nope_dim:])], axis=-1)
    q_BLHx = axes.constrain(q_BLHx, q_names)
    kv_BLx = checkpoint_name(self.kv_down(x_BLD), "key_proj")
    latent_BLZ = self.kv_norm(kv_BLx[..., :self.latent_dim])
    k_rope_BL1K = self._rotate(rotary, kv_BLx[..., None, self.latent_dim:])
    if self.index_topk:
      o_BLHU, cache, loss = self._sparse(
          rotary, x_BLD, q_latent_BLQ, q_BLHx, latent_BLZ, k_rope_BL1K,
          segment_ids_BL=segment_ids_BL, cache=cache,
          positions_BL=positions_BL, index_loss=index_loss)
    elif cache is None:
      k_BLHx, v_BLHU = self._keys_values(latent_BLZ, k_rope_BL1K)
      o_BLHU = self.kernel(q_BLHx, axes.constrain(k_BLHx, kv_names),
                           axes.constrain(v_BLHU, kv_names),
                           scale=self.scale, segment_ids_BL=segment_ids_BL,
                           logit_softcap=self.logit_softcap)
    else:
      kv_cache_lib.check_decode_args(segment_ids_BL, positions_BL)
      cache = cache.write(latent_BLZ[:, :, None], k_rope_BL1K,
                          positions_BL[:, 0])
      c_BS1Z, r_BS1K = cache.gather()
      k_BSHx, v_BSHU = self._keys_values(c_BS1Z[:, :, 0], r_BS1K)
      mask_BLS = attention_kernels.positions_mask(positions_BL, cache.length)
      o_BLHU = self.kernel(q_BLHx, axes.constrain(k_BSHx, kv_names),
                           axes.constrain(v_BSHU, kv_names),
                           scale=self.scale, logit_softcap=self.logit_softcap,
                           mask_BLS=mask_BLS)
    o_BLHU = checkpoint_name(axes.constrain(o_BLHU, q_names),
                             "attention_context")
    out_BLD = checkpoint_name(self.output(o_BLHU), "out_proj")
    if index_loss:
      return out_BLD, loss
    return out_BLD if cache is None else (out_BLD, cache)
