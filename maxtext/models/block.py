"""One decoder layer: `Block` (attention then MLP or experts, pre-norm and
optional post-norms), built for its layer kind
(`maxtext.common.layer_pattern`), and how the decoder runs one
(`block_runner`: rotary per window and head size, KV cache or remat policy,
the layer's own inputs: `LayerInputs`).

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.common import axes
from maxtext.common import layer_pattern
from maxtext.common.model_config import ModelConfig
from maxtext.kernels import dispatch
from maxtext.layers import attention
from maxtext.layers import gated_deltanet
from maxtext.layers import kv_cache as kv_cache_lib
from maxtext.layers import linear
from maxtext.layers import mla
from maxtext.layers import mlp
from maxtext.layers import moe
from maxtext.layers import norm
from maxtext.layers import remat
from maxtext.layers import rope

# The residual stream's logical axes, constrained at every block boundary.
RESIDUAL = (axes.BATCH, axes.LENGTH, axes.EMBED)


class LayerInputs(NamedTuple):
  """What one layer reads besides the residual stream (None: nothing).

  Attributes:
    per_layer_BLP: Its own input (`ModelConfig.per_layer_input_dim`).
    kv: For a layer that shares keys and values (`LayerKind.kv_shared`),
      the (keys, values) of the layer that stores them, without a KV cache
      (with one, that layer's cache is this layer's `cache`, read only).
  """
  per_layer_BLP: jax.Array | None = None
  kv: tuple[jax.Array, jax.Array] | None = None


def embed_norm(cfg: ModelConfig) -> norm.RMSNorm:
  return cfg.norm.rms_norm(cfg.embed_dim, axis_name=axes.EMBED,
                           param_dtype=cfg.param_dtype)


def make_attention(cfg: ModelConfig, *, kernel: dispatch.Kernel,
                   rngs: nnx.Rngs, kv_shared: bool = False,
                   linear: bool = False
                   ) -> attention.Attention | mla.MLA | (
                       gated_deltanet.GatedDeltaNet):
  """The attention of `cfg` (GQA or MLA) from its parts; `kv_shared`: it
  reads another layer's keys and values; `linear`: a Gated DeltaNet layer
  instead."""
  widths = dict(embed_dim=cfg.embed_dim, dtype=cfg.dtype,
                param_dtype=cfg.param_dtype, kernel=kernel, rngs=rngs)
  if linear:
    return gated_deltanet.GatedDeltaNet(cfg.linear_attention,
                                        norm_eps=cfg.norm.eps, **widths)
  if cfg.attention.type == "mla":
    return mla.MLA(cfg.attention, cfg.mla, cfg.rope, **widths)
  return attention.Attention(cfg.attention, norm_config=cfg.norm,
                             kv_shared=kv_shared, **widths)


class Block(nnx.Module):
  """Residual block: attention then gated MLP or experts, each with a
  pre-norm, a post-norm or both, as layer kind `kind` has them; with
  `cfg.layer_scalar` its output times its `scalar` [1].

  With `cfg.moe.with_mlp` an expert layer runs the dense MLP and the experts
  side by side on the same stream, each between norms of its own (dense:
  `pre_mlp_norm`, `post_dense_norm`; experts: `pre_moe_norm`,
  `post_moe_norm`), and adds their outputs before `post_mlp_norm`
  (Gemma 4 26b-a4b).

  With `cfg.per_layer_input_dim` P, after the MLP's residual add the block
  adds `post_per_layer_norm(per_layer_projection(unit(per_layer_gate(x),
  per_layer_BLP)))`, `unit` the MLP's gated unit (`mlp.GATED_UNITS`: for
  GeGLU `gelu(gate) * input`), `per_layer_gate` D -> P and
  `per_layer_projection` P -> D (Gemma 4 e2b, e4b)."""

  def __init__(self, cfg: ModelConfig, kind: layer_pattern.LayerKind, *,
               kernel: dispatch.Kernel, rngs: nnx.Rngs):
    experts = kind.experts
    cfg = kind.config(cfg)
    self.pre_attention_norm = embed_norm(cfg) if cfg.pre_norms else None
    attention = make_attention(cfg, kernel=kernel, rngs=rngs,
                               kv_shared=kind.kv_shared, linear=kind.linear)
    self.attention = None if kind.linear else attention
    self.linear_attention = attention if kind.linear else None
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
    width = cfg.per_layer_input_dim
    dtypes = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
    self.per_layer_gate = linear.Linear(
        (cfg.embed_dim,), (width,), in_axes=(axes.EMBED,), out_axes=(None,),
        **dtypes) if width else None
    self.per_layer_projection = linear.Linear(
        (width,), (cfg.embed_dim,), in_axes=(None,), out_axes=(axes.EMBED,),
        **dtypes) if width else None
    self.post_per_layer_norm = embed_norm(cfg) if width else None
    self.gated_unit = mlp.GATED_UNITS[cfg.mlp.activation] if width else None

  def __call__(self, x_BLD: jax.Array, rotary: rope.Rotary | None, *,
               window: int | None, chunk: int | None = None,
               segment_ids_BL: jax.Array | None,
               positions_BL: jax.Array | None = None,
               cache: kv_cache_lib.KVCache | None = None,
               inputs: LayerInputs = LayerInputs(),
               store_kv: bool = False,
               image_blocks_BL: jax.Array | None = None,
               valid_BL: jax.Array | None = None,
               index_loss: bool = False):
    """Returns (new residual stream, cache or None, aux dict or None, its
    keys and values or None); `rotary` None: the layer has none. The aux
    dict holds the experts' values (`moe.MoE`) and, with `index_loss` (no
    cache) and a DeepSeek Sparse Attention indexer, its "indexer_loss"
    (`mla.MLA`).

    `inputs`: the layer's own input and, for a layer that shares keys and
    values, another layer's. `store_kv` (no cache): return this layer's
    keys and values for the layers that share them. `image_blocks_BL`:
    tokens of one image attend to each other (`attention.Attention`).
    `valid_BL` (with a cache): which tokens are real, for a Gated DeltaNet
    layer's state (`gated_deltanet.GatedDeltaNet`).
    """
    h_BLD = _norm(self.pre_attention_norm, x_BLD)
    if self.linear_attention is not None:
      h_BLD = self.linear_attention(h_BLD, segment_ids_BL=segment_ids_BL,
                                    cache=cache, valid_BL=valid_BL)
      return self._feed_forward(x_BLD, h_BLD, cache, inputs, None)
    kv = inputs.kv
    if store_kv and cache is None:
      kv = self.attention.keys_values(h_BLD, rotary)
    # Only GQA layers share keys and values or take image blocks (MLA takes
    # neither: `model_checks`).
    gqa_only = {} if kv is None else {"kv": kv}
    if image_blocks_BL is not None:
      gqa_only["image_blocks_BL"] = image_blocks_BL
    indexer = (index_loss and cache is None and
               isinstance(self.attention, mla.MLA) and
               self.attention.index_topk > 0)
    h_BLD = self.attention(h_BLD, rotary, window=window, chunk=chunk,
                           segment_ids_BL=segment_ids_BL, cache=cache,
                           positions_BL=positions_BL, **gqa_only,
                           **({"index_loss": True} if indexer else {}))
    loss = None
    if indexer:
      h_BLD, loss = h_BLD
    x_BLD, cache, aux, kv = self._feed_forward(x_BLD, h_BLD, cache, inputs,
                                               kv if store_kv else None)
    if loss is not None:
      aux = {**(aux or {}), "indexer_loss": loss}
    return x_BLD, cache, aux, kv

  def _feed_forward(self, x_BLD, h_BLD, cache, inputs, kv):
    """The block after its attention's output `h_BLD` (with a cache, with
    the new cache), as `__call__` returns it."""
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
    if self.per_layer_gate is not None:
      h_BLP = self.gated_unit(self.per_layer_gate(x_BLD),
                              inputs.per_layer_BLP.astype(x_BLD.dtype))
      x_BLD = x_BLD + self.post_per_layer_norm(
          self.per_layer_projection(h_BLP))
    if self.scalar is not None:
      x_BLD = x_BLD * self.scalar[...].astype(x_BLD.dtype)
    return x_BLD, cache, aux, kv


def _norm(norm_layer: norm.RMSNorm | None, x_BLD: jax.Array) -> jax.Array:
  return x_BLD if norm_layer is None else norm_layer(x_BLD)


def _at(block: Block, rank: int | None) -> Block:
  """`block`, or with `rank` the block at that index of its parameters'
  leading axis (a scan's group of layers of one kind)."""
  if rank is None:
    return block
  graphdef, state = nnx.split(block)
  return nnx.merge(graphdef, jax.tree.map(lambda a: a[rank], state))


def _with_remat(call_block, cfg: ModelConfig, config: remat.RematConfig):
  """`call_block(block, x_BLD, layer, inputs) -> (x_BLD, aux, kv)` under
  `config`, as `(block, x_BLD, layer, inputs, rank)` (`_at`).

  The block is indexed at `rank` inside the rematerialised function: its
  residual is then the scan's slice of the stacked parameters, which
  autodiff keeps by reference, not a per-layer copy stacked in the forward
  pass (a copy of every weight of the stack).
  """
  if config.policy == "none":
    return lambda block, x_BLD, layer, inputs, rank: call_block(
        _at(block, rank), x_BLD, layer, inputs)

  def run_block(block: Block, x_BLD: jax.Array, layer: layer_pattern.Layer,
                inputs: LayerInputs, rank: int | None):
    graphdef, state = nnx.split(block)

    def apply(state, x_BLD, inputs):
      return call_block(_at(nnx.merge(graphdef, state), rank), x_BLD, layer,
                        inputs)

    # Inside a scan, CSE cannot merge the recomputation; skip its barrier.
    return remat.remat(apply, config.policy,
                       prevent_cse=not cfg.scan_layers,
                       custom=config.custom)(state, x_BLD, inputs)

  return run_block


def block_runner(cfg: ModelConfig, pattern: tuple[layer_pattern.Layer, ...],
                 positions_BL: jax.Array, segment_ids_BL: jax.Array | None, *,
                 cached: bool, page_table_BN: jax.Array | None = None,
                 remat_config: remat.RematConfig = remat.RematConfig(),
                 image_blocks_BL: jax.Array | None = None,
                 valid_BL: jax.Array | None = None,
                 index_loss: bool = False):
  """`run_block(block, x_BLD, layer, layer_cache, inputs, rank=None) ->
  (x_BLD, layer_cache, aux, kv)` for the layers of `pattern`, `inputs` its
  `LayerInputs`, aux the block's aux dict (`Block.__call__`; indexers'
  losses with `index_loss`) or None, kv the keys and
  values of a layer that `stores_kv` (without a cache), else None. With
  `rank`, `block`'s parameters carry a leading axis and the layer's are at
  `rank` (`_at`).

  With `cached`, each block reads and writes its layer's KV cache at
  `positions_BL` (a `PagedKVCache` through `page_table_BN`, which every
  layer shares); a layer that shares keys and values gets the cache of the
  layer that stores them, reads it and returns it unchanged. Otherwise
  `layer_cache` is None and each block runs under `remat_config`.
  `image_blocks_BL`: each image's tokens attend to each other
  (`maxtext.layers.vision.image_blocks`). `valid_BL` (cached): which tokens
  are real (a Gated DeltaNet layer's state skips a prompt's padding); a
  Gated DeltaNet layer's cache is its own, never paged.
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
    def run_block(block, x_BLD, layer, layer_cache, inputs, rank=None):
      paged = page_table_BN is not None and not layer.kind.linear
      if paged:
        layer_cache = kv_cache_lib.PagedView(layer_cache, page_table_BN)
      x_BLD, layer_cache, aux, _ = _at(block, rank)(
          x_BLD, rotary_of(layer), window=layer.window, chunk=layer.chunk,
          segment_ids_BL=segment_ids_BL, positions_BL=positions_BL,
          cache=layer_cache, inputs=inputs, image_blocks_BL=image_blocks_BL,
          valid_BL=valid_BL)
      if paged:
        layer_cache = layer_cache.pages
      return axes.constrain(x_BLD, RESIDUAL), layer_cache, aux, None
    return run_block

  def call_block(block: Block, x_BLD: jax.Array, layer, inputs):
    x_BLD, _, aux, kv = block(x_BLD, rotary_of(layer), window=layer.window,
                              chunk=layer.chunk,
                              segment_ids_BL=segment_ids_BL,
                              positions_BL=positions_BL, inputs=inputs,
                              store_kv=layer.stores_kv,
                              image_blocks_BL=image_blocks_BL,
                              index_loss=index_loss)
    return axes.constrain(x_BLD, RESIDUAL), aux, kv

  remat_block = _with_remat(call_block, cfg, remat_config)

  def run_remat_block(block, x_BLD, layer, layer_cache, inputs, rank=None):
    del layer_cache  # None.
    x_BLD, aux, kv = remat_block(block, x_BLD, layer, inputs, rank)
    return x_BLD, None, aux, kv
  return run_remat_block


def _rotary_key(cfg: ModelConfig, layer: layer_pattern.Layer):
  """What a layer's rotary depends on: local or global, and its head size;
  None for a global layer without rotary (`cfg.rope.global_nope`) and a
  Gated DeltaNet layer.

  Local layers share the global rotary when `cfg.rope.local_theta` is
  None."""
  if layer.kind.linear or (layer.is_global and cfg.rope.global_nope):
    return None
  local = not layer.is_global and cfg.rope.local_theta is not None
  return local, layer.kind.config(cfg).attention.head_dim


def _rotary(cfg: ModelConfig, positions_BL: jax.Array, *, local: bool):
  """The rotary of a local (`local`, with `cfg.rope.local_theta`) or
  global layer of `cfg`."""
  if local:
    return cfg.rope.local_rotary(positions_BL, cfg.attention.head_dim)
  return cfg.rope.global_rotary(positions_BL, cfg.attention.head_dim)
