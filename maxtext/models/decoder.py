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

Shape key: B batch, L length, D embed dim, V vocab.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.common import axes
from maxtext.common.model_config import ModelConfig
from maxtext.layers import attention
from maxtext.layers import embedding
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
               segment_ids_BL: jax.Array | None) -> jax.Array:
    h_BLD = self.attention(self.pre_attention_norm(x_BLD), rotary,
                           window=window, segment_ids_BL=segment_ids_BL)
    if self.post_attention_norm is not None:
      h_BLD = self.post_attention_norm(h_BLD)
    x_BLD = x_BLD + h_BLD
    h_BLD = self.mlp(self.pre_mlp_norm(x_BLD))
    if self.post_mlp_norm is not None:
      h_BLD = self.post_mlp_norm(h_BLD)
    return x_BLD + h_BLD


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

  def __call__(
      self,
      tokens_BL: jax.Array,
      positions_BL: jax.Array | None = None,
      segment_ids_BL: jax.Array | None = None,
  ) -> jax.Array:
    """Returns float32 logits [B, L, V].

    Args:
      tokens_BL: Token ids.
      positions_BL: Position of each token in its sequence (rotary); None
        means 0..L-1 in every row.
      segment_ids_BL: Packed-sequence ids; a token attends only to earlier
        tokens of its own segment. None: one sequence per row.
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

    run_block = _with_remat(call_block, cfg)

    x_BLD = axes.constrain(self.embedder(tokens_BL), _RESIDUAL)
    windows = cfg.layer_windows()
    if cfg.scan_layers:
      x_BLD = self._scan_blocks(x_BLD, windows, run_block)
    else:
      for block, window in zip(self.blocks, windows):
        x_BLD = run_block(block, x_BLD, window)
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
    return logits_BLV

  def _scan_blocks(self, x_BLD, windows, run_block):
    """Runs the stacked blocks: a scan over pattern groups, then the rest."""
    graphdef, stacked = nnx.split(self.blocks)
    period = pattern_period(windows)
    num_groups = len(windows) // period

    def layer(state, index):
      return nnx.merge(graphdef, jax.tree.map(lambda a: a[index], state))

    def group_step(x_BLD, group_state):
      for offset in range(period):
        x_BLD = run_block(layer(group_state, offset), x_BLD, windows[offset])
      return x_BLD, None

    grouped = jax.tree.map(
        lambda a: a[:num_groups * period].reshape(num_groups, period,
                                                  *a.shape[1:]), stacked)
    x_BLD, _ = jax.lax.scan(group_step, x_BLD, grouped)
    for index in range(num_groups * period, len(windows)):
      x_BLD = run_block(layer(stacked, index), x_BLD, windows[index])
    return x_BLD
