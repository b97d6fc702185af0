"""One decoder layer: `Block` (attention then MLP or experts, pre-norm and
optional post-norms), built for its layer kind
(`maxtext.common.layer_pattern`), and how the decoder runs one
(`block_runner`: rotary per window and head size, KV cache or remat policy).

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.common import axes
from maxtext.common import layer_pattern
from maxtext.common.model_config import ModelConfig
from maxtext.kernels import dispatch
from maxtext.layers import attention
from maxtext.layers import kv_cache as kv_cache_lib
from maxtext.layers import mla
from maxtext.layers import mlp
from maxtext.layers import moe
from maxtext.layers import norm
from maxtext.layers import remat
from maxtext.layers import rope

# The residual stream's logical axes, constrained at every block boundary.
RESIDUAL = (axes.BATCH, axes.LENGTH, axes.EMBED)


def embed_norm(cfg: ModelConfig) -> norm.RMSNorm:
  return cfg.norm.rms_norm(cfg.embed_dim, axis_name=axes.EMBED,
                           param_dtype=cfg.param_dtype)


def make_attention(cfg: ModelConfig, *, kernel: dispatch.Kernel,
                   rngs: nnx.Rngs) -> attention.Attention | mla.MLA:
  """The attention of `cfg` (GQA or MLA) from its parts."""
  widths = dict(embed_dim=cfg.embed_dim, dtype=cfg.dtype,
                param_dtype=cfg.param_dtype, kernel=kernel, rngs=rngs)
  if cfg.attention.type == "mla":
    return mla.MLA(cfg.attention, cfg.mla, cfg.rope, **widths)
  return attention.Attention(cfg.attention, norm_config=cfg.norm, **widths)


class Block(nnx.Module):
  """Residual block: attention then gated MLP or experts, each with a
  pre-norm, a post-norm or both, as layer kind `kind` has them; with
  `cfg.layer_scalar` its output times its `scalar` [1].

  With `cfg.moe.with_mlp` an expert layer runs the dense MLP and the experts
  side by side on the same stream, each between norms of its own (dense:
  `pre_mlp_norm`, `post_dense_norm`; experts: `pre_moe_norm`,
  `post_moe_norm`), and adds their outputs before `post_mlp_norm`
  (Gemma 4 26b-a4b)."""

  def __init__(self, cfg: ModelConfig, kind: layer_pattern.LayerKind, *,
               kernel: dispatch.Kernel, rngs: nnx.Rngs):
    experts = kind.experts
    cfg = kind.config(cfg)
    self.pre_attention_norm = embed_norm(cfg) if cfg.pre_norms else None
    self.attention = make_attention(cfg, kernel=kernel, rngs=rngs)
    self.post_attention_norm = embed_norm(cfg) if cfg.post_norms else None
    self.pre_mlp_norm = embed_norm(cfg) if cfg.pre_norms else None
    widths = dict(embed_dim=cfg.embed_dim, dtype=cfg.dtype,
                  param_dtype=cfg.param_dtype, rngs=rngs)
    both = experts and cfg.moe.with_mlp
    self.mlp = (mlp.MLP(cfg.mlp, **widths) if both or not experts
                else None)
    self.moe = (moe.MoE(cfg.moe, activation=cfg.mlp.activation,
                        norm_eps=cfg.norm.eps, **widths)
                if experts else None)
    self.pre_moe_norm = embed_norm(cfg) if both and cfg.pre_norms else None
    self.post_dense_norm, self.post_moe_norm = (
        (embed_norm(cfg), embed_norm(cfg)) if both and cfg.post_norms
        else (None, None))
    self.post_mlp_norm = embed_norm(cfg) if cfg.post_norms else None
    self.scalar = (axes.param(jnp.ones((1,), cfg.param_dtype), (None,))
                   if cfg.layer_scalar else None)

  def __call__(self, x_BLD: jax.Array, rotary: rope.Rotary | None, *,
               window: int | None, chunk: int | None = None,
               segment_ids_BL: jax.Array | None,
               positions_BL: jax.Array | None = None,
               cache: kv_cache_lib.KVCache | None = None):
    """Returns (new residual stream, cache or None, moe aux dict or None);
    `rotary` None: the layer has none."""
    h_BLD = self.attention(_norm(self.pre_attention_norm, x_BLD), rotary,
                           window=window, chunk=chunk,
                           segment_ids_BL=segment_ids_BL, cache=cache,
                           positions_BL=positions_BL)
    if cache is not None:
      h_BLD, cache = h_BLD
    if self.post_attention_norm is not None:
      h_BLD = self.post_attention_norm(h_BLD)
    x_BLD = x_BLD + h_BLD
    aux = None
    if self.moe is None:
      h_BLD = self.mlp(_norm(self.pre_mlp_norm, x_BLD))
    elif self.mlp is None:
      h_BLD, aux = self.moe(_norm(self.pre_mlp_norm, x_BLD), x_BLD)
    else:
      dense_BLD = _norm(self.post_dense_norm,
                        self.mlp(_norm(self.pre_mlp_norm, x_BLD)))
      h_BLD, aux = self.moe(_norm(self.pre_moe_norm, x_BLD), x_BLD)
      h_BLD = dense_BLD + _norm(self.post_moe_norm, h_BLD)
    if self.post_mlp_norm is not None:
      h_BLD = self.post_mlp_norm(h_BLD)
    x_BLD = x_BLD + h_BLD
    if self.scalar is not None:
      x_BLD = x_BLD * self.scalar[...].astype(x_BLD.dtype)
    return x_BLD, cache, aux


def _norm(norm_layer: norm.RMSNorm | None, x_BLD: jax.Array) -> jax.Array:
  return x_BLD if norm_layer is None else norm_layer(x_BLD)


def _with_remat(call_block, cfg: ModelConfig, config: remat.RematConfig):
  """`call_block(block, x_BLD, layer) -> (x_BLD, aux)` under `config`."""
  if config.policy == "none":
    return call_block

  def run_block(block: Block, x_BLD: jax.Array, layer: layer_pattern.Layer):
    graphdef, state = nnx.split(block)

    def apply(state, x_BLD):
      return call_block(nnx.merge(graphdef, state), x_BLD, layer)

    # Inside a scan, CSE cannot merge the recomputation; skip its barrier.
    return remat.remat(apply, config.policy,
                       prevent_cse=not cfg.scan_layers,
                       custom=config.custom)(state, x_BLD)

  return run_block


def block_runner(cfg: ModelConfig, pattern: tuple[layer_pattern.Layer, ...],
                 positions_BL: jax.Array, segment_ids_BL: jax.Array | None, *,
                 cached: bool, page_table_BN: jax.Array | None = None,
                 remat_config: remat.RematConfig = remat.RematConfig()):
  """`run_block(block, x_BLD, layer, layer_cache) -> (x_BLD, layer_cache,
  aux)` for the layers of `pattern`, aux the block's MoE aux dict or None.

  With `cached`, each block reads and writes its layer's KV cache at
  `positions_BL` (a `PagedKVCache` through `page_table_BN`, which every
  layer shares); otherwise `layer_cache` is None and each block runs under
  `remat_config`.
  """
  rotaries = {None: None}  # Built here, outside the layers' scans, once
  for layer in pattern:     # per key.
    key = _rotary_key(cfg, layer)
    if key not in rotaries:
      rotaries[key] = _rotary(layer.kind.config(cfg), positions_BL,
                              local=key[0])

  def rotary_of(layer):
    return rotaries[_rotary_key(cfg, layer)]

  if cached:
    def run_block(block, x_BLD, layer, layer_cache):
      if page_table_BN is not None:
        layer_cache = kv_cache_lib.PagedView(layer_cache, page_table_BN)
      x_BLD, layer_cache, aux = block(x_BLD, rotary_of(layer),
                                      window=layer.window, chunk=layer.chunk,
                                      segment_ids_BL=segment_ids_BL,
                                      positions_BL=positions_BL,
                                      cache=layer_cache)
      if page_table_BN is not None:
        layer_cache = layer_cache.pages
      return axes.constrain(x_BLD, RESIDUAL), layer_cache, aux
    return run_block

  def call_block(block: Block, x_BLD: jax.Array, layer):
    x_BLD, _, aux = block(x_BLD, rotary_of(layer), window=layer.window,
                          chunk=layer.chunk, segment_ids_BL=segment_ids_BL,
                          positions_BL=positions_BL)
    return axes.constrain(x_BLD, RESIDUAL), aux

  remat_block = _with_remat(call_block, cfg, remat_config)

  def run_remat_block(block, x_BLD, layer, layer_cache):
    del layer_cache  # None.
    x_BLD, aux = remat_block(block, x_BLD, layer)
    return x_BLD, None, aux
  return run_remat_block


def _rotary_key(cfg: ModelConfig, layer: layer_pattern.Layer):
  """What a layer's rotary depends on: local or global, and its head size;
  None for a global layer without rotary (`cfg.rope.global_nope`).

  Local layers share the global rotary when `cfg.rope.local_theta` is
  None."""
  if layer.is_global and cfg.rope.global_nope:
    return None
  local = not layer.is_global and cfg.rope.local_theta is not None
  return local, layer.kind.config(cfg).attention.head_dim


def _rotary(cfg: ModelConfig, positions_BL: jax.Array, *, local: bool):
  """The rotary of a local (`local`, with `cfg.rope.local_theta`) or
  global layer of `cfg`."""
  if local:
    return cfg.rope.local_rotary(positions_BL, cfg.attention.head_dim)
  return cfg.rope.global_rotary(positions_BL, cfg.attention.head_dim)
