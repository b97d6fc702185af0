"""The generic dense decoder: embed -> blocks -> final norm -> output head.

Every dense family is this model with a different `ModelConfig`.

Layouts of the blocks' parameters:
  scan_layers=True: one `Block` whose parameters are stacked over layers
    (leading axis, logical name "layers"), built with `nnx.vmap`. The forward
    pass groups the layers by the repeating pattern of sliding windows (e.g.
    Gemma 3's 5 local + 1 global) and scans over the groups, unrolling one
    group; so compile time grows with the pattern length, not with depth.
    Layers that do not fill a whole group at the end are unrolled.
  scan_layers=False: an `nnx.List` of `Block`s, one per layer.

Each block runs under the remat policy `cfg.remat_policy`
(`maxtext.layers.remat`). The residual stream is constrained to the logical
axes (batch, length, embed) at every block boundary and the logits to
(batch, length, vocab); the constraints apply only under
`axes.activation_sharding` (the train step sets it from the compute rules).

Decoding: `init_cache(batch, length)` gives an empty KV cache (per layer;
stacked over layers with scan_layers, a tuple of per-layer caches without);
`model(tokens, positions, cache=cache)` runs the tokens (a prompt, then one
token per step) through the same blocks, writing their keys and values at
their positions, and returns (logits, cache). Without a cache nothing
changes.

Shape key: B batch, L length, D embed dim, V vocab.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.common import axes
from maxtext.common.model_config import ModelConfig
from maxtext.layers import attention
from maxtext.layers import embedding
from maxtext.layers import kv_cache as kv_cache_lib
from maxtext.layers import linear
from maxtext.layers import mlp
from maxtext.layers import norm
from maxtext.layers import remat
from maxtext.layers import rope

_RESIDUAL = (axes.BATCH, axes.LENGTH, axes.EMBED)


def _embed_norm(cfg: ModelConfig) -> norm.RMSNorm:
  return norm.RMSNorm(cfg.embed_dim, axis_name=axes.EMBED, eps=cfg.norm_eps,
                      offset=cfg.norm_offset, param_dtype=cfg.param_dtype)


class Block(nnx.Module):
  """Pre-norm residual block: attention then gated MLP (optional post-norms)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.pre_attention_norm = _embed_norm(cfg)
    self.attention = attention.Attention(cfg, rngs=rngs)
    self.post_attention_norm = _embed_norm(cfg) if cfg.post_norms else None
    self.pre_mlp_norm = _embed_norm(cfg)
    self.mlp = mlp.MLP(cfg, rngs=rngs)
    self.post_mlp_norm = _embed_norm(cfg) if cfg.post_norms else None

  def __call__(self, x_BLD: jax.Array, rotary: rope.Rotary, *,
               window: int | None,
               segment_ids_BL: jax.Array | None,
               cache: kv_cache_lib.KVCache | None = None,
               positions_BL: jax.Array | None = None):
    """Returns the new residual stream, and the cache when one is given."""
    h_BLD = self.attention(self.pre_attention_norm(x_BLD), rotary,
                           window=window, segment_ids_BL=segment_ids_BL,
                           cache=cache, positions_BL=positions_BL)
    if cache is not None:
      h_BLD, cache = h_BLD
    if self.post_attention_norm is not None:
      h_BLD = self.post_attention_norm(h_BLD)
    x_BLD = x_BLD + h_BLD
    h_BLD = self.mlp(self.pre_mlp_norm(x_BLD))
    if self.post_mlp_norm is not None:
      h_BLD = self.post_mlp_norm(h_BLD)
    return x_BLD + h_BLD if cache is None else (x_BLD + h_BLD, cache)


def _with_remat(call_block, cfg: ModelConfig):
  """`call_block(block, x_BLD, window)` under `cfg.remat_policy`."""
  if cfg.remat_policy == "none":
    return call_block

  def run_block(block: Block, x_BLD: jax.Array,
                window: int | None) -> jax.Array:
    graphdef, state = nnx.split(block)

    def apply(state, x_BLD):
      return call_block(nnx.merge(graphdef, state), x_BLD, window)

    # Inside a scan, CSE cannot merge the recomputation; skip its barrier.
    return remat.remat(apply, cfg.remat_policy,
                       prevent_cse=not cfg.scan_layers)(state, x_BLD)

  return run_block


def pattern_period(windows: tuple[int | None, ...]) -> int:
  """Smallest p with windows[i] == windows[i % p] for every layer i."""
  for period in range(1, len(windows) + 1):
    if all(w == windows[i % period] for i, w in enumerate(windows)):
      return period
  raise AssertionError("unreachable: the full length is always a period")


class Decoder(nnx.Module):
  """Decoder-only transformer returning float32 logits [B, L, V]."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embedder = embedding.Embedder(
        cfg.vocab_size, cfg.embed_dim, scale_by_sqrt_dim=cfg.scale_embeddings,
        dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
    if cfg.scan_layers:
      @nnx.split_rngs(splits=cfg.num_layers)
      @nnx.vmap(axis_size=cfg.num_layers,
                transform_metadata={nnx.PARTITION_NAME: axes.LAYERS})
      def stacked_blocks(rngs: nnx.Rngs) -> Block:
        return Block(cfg, rngs=rngs)

      self.blocks = stacked_blocks(rngs)
    else:
      self.blocks = nnx.List(
          [Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    self.final_norm = _embed_norm(cfg)
    if cfg.tie_embeddings:
      self.head = None
    else:
      self.head = linear.Linear(
          (cfg.embed_dim,), (cfg.vocab_size,), in_axes=(axes.EMBED,),
          out_axes=(axes.VOCAB,), dtype=cfg.dtype,
          param_dtype=cfg.param_dtype, rngs=rngs)

  def init_cache(self, batch: int, length: int):
    """An empty KV cache for `batch` rows of up to `length` positions."""
    cfg = self.cfg

    def empty(_):
      return kv_cache_lib.KVCache.zeros(batch, length, cfg.num_kv_heads,
                                        cfg.head_dim, jnp.dtype(cfg.dtype))

    if cfg.scan_layers:
      return jax.vmap(empty)(jnp.arange(cfg.num_layers))
    return tuple(empty(i) for i in range(cfg.num_layers))

  def __call__(
      self,
      tokens_BL: jax.Array,
      positions_BL: jax.Array | None = None,
      segment_ids_BL: jax.Array | None = None,
      *,
      cache=None,
  ):
    """Returns float32 logits [B, L, V] (and the cache when one is given).

    Args:
      tokens_BL: Token ids.
      positions_BL: Position of each token in its sequence (rotary); None
        means 0..L-1 in every row. With a cache, consecutive in each row.
      segment_ids_BL: Packed-sequence ids; a token attends only to earlier
        tokens of its own segment. None: one sequence per row.
      cache: From `init_cache` (or a previous call): the tokens attend to
        the cached keys by position and their keys are written there.
    """
    cfg = self.cfg
    if positions_BL is None:
      positions_BL = jnp.broadcast_to(jnp.arange(tokens_BL.shape[1]),
                                      tokens_BL.shape)
    global_rotary = rope.Rotary.at(positions_BL,
                                   rope.global_inverse_frequencies(cfg))
    local_rotary = rope.Rotary.at(positions_BL,
                                  rope.local_inverse_frequencies(cfg))

    def call_block(block: Block, x_BLD: jax.Array,
                   window: int | None) -> jax.Array:
      rotary = global_rotary if window is None else local_rotary
      x_BLD = block(x_BLD, rotary, window=window,
                    segment_ids_BL=segment_ids_BL)
      return axes.constrain(x_BLD, _RESIDUAL)

    if cache is None:
      remat_block = _with_remat(call_block, cfg)

      def run_block(block, x_BLD, window, layer_cache):
        del layer_cache  # None.
        return remat_block(block, x_BLD, window), None
    else:
      def run_block(block, x_BLD, window, layer_cache):
        rotary = global_rotary if window is None else local_rotary
        x_BLD, layer_cache = block(x_BLD, rotary, window=window,
                                   segment_ids_BL=segment_ids_BL,
                                   cache=layer_cache,
                                   positions_BL=positions_BL)
        return axes.constrain(x_BLD, _RESIDUAL), layer_cache

    x_BLD = axes.constrain(self.embedder(tokens_BL), _RESIDUAL)
    windows = cfg.layer_windows()
    if cfg.scan_layers:
      x_BLD, cache = self._scan_blocks(x_BLD, windows, run_block, cache)
    else:
      layer_caches = cache or (None,) * len(windows)
      new_caches = []
      for block, window, layer_cache in zip(self.blocks, windows,
                                            layer_caches):
        x_BLD, layer_cache = run_block(block, x_BLD, window, layer_cache)
        new_caches.append(layer_cache)
      cache = None if cache is None else tuple(new_caches)
    x_BLD = self.final_norm(x_BLD)
    if self.head is None:
      logits_BLV = self.embedder.attend(x_BLD)
    else:
      logits_BLV = self.head(x_BLD)
    logits_BLV = axes.constrain(logits_BLV.astype(jnp.float32),
                                (axes.BATCH, axes.LENGTH, axes.VOCAB))
    if cfg.final_logit_softcap:
      cap = cfg.final_logit_softcap
      logits_BLV = cap * jnp.tanh(logits_BLV / cap)
    return logits_BLV if cache is None else (logits_BLV, cache)

  def _scan_blocks(self, x_BLD, windows, run_block, cache):
    """Runs the stacked blocks: a scan over pattern groups, then the rest.

    `cache` (stacked over layers, or None) is scanned alongside the
    parameters; returns (x_BLD, new cache or None).
    """
    graphdef, stacked = nnx.split(self.blocks)
    period = pattern_period(windows)
    num_groups = len(windows) // period

    def at(tree, index):
      return jax.tree.map(lambda a: a[index], tree)

    def layer(state, index):
      return nnx.merge(graphdef, at(state, index))

    def stack(caches):
      return jax.tree.map(lambda *a: jnp.stack(a), *caches)

    def group_step(x_BLD, group):
      group_state, group_cache = group
      caches = []
      for offset in range(period):
        x_BLD, layer_cache = run_block(layer(group_state, offset), x_BLD,
                                       windows[offset],
                                       at(group_cache, offset))
        caches.append(layer_cache)
      return x_BLD, stack(caches)

    def grouped(a):
      return a[:num_groups * period].reshape(num_groups, period, *a.shape[1:])

    x_BLD, scanned_cache = jax.lax.scan(
        group_step, x_BLD, jax.tree.map(grouped, (stacked, cache)))
    caches = [jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]),
                           scanned_cache)]
    for index in range(num_groups * period, len(windows)):
      x_BLD, layer_cache = run_block(layer(stacked, index), x_BLD,
                                     windows[index], at(cache, index))
      caches.append(jax.tree.map(lambda a: a[None], layer_cache))
    return x_BLD, jax.tree.map(lambda *a: jnp.concatenate(a), *caches)
