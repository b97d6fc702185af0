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

Pipeline parallelism (`cfg.pipeline_stages` = S > 1, training only): the
stacked layers are cut into S * R chunks (R = `cfg.pipeline_repeats`) viewed
as [S, R, layers per chunk], chunk r S + s at [s, r], and run as a GPipe
(R = 1) or circular (R > 1) schedule over `cfg.pipeline_microbatches`
slices of the batch (`maxtext.layers.pipeline`); each row's positions and
segment ids travel with it through the stages. The leading "layers" axis is
sharded over the `stage` mesh axis in contiguous blocks, so for R = 1 the
view is free; for R > 1 it moves each stage's chunks to it once per call
(an all-to-all over `stage`, outside the schedule's loop). When every chunk
has the same local/global pattern, a chunk runs as above; otherwise each
layer's window is data indexed by stage and pass, and the layer switches
between the distinct windows (under the vmap over stages every branch is
computed, so such layers cost about one block per distinct window: prefer
stage and repeat counts that give every chunk the same pattern). With a KV
cache (decoding) the layers run without the pipeline.

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
changes. A paged cache (`kv_cache.paged_like`: pages only) comes with
`page_table_BN=`, one table for every layer: each layer's attention reads
its pages through it, and the layer scan closes over it rather than
carrying a copy per layer.

Mixture of experts (`cfg.num_experts` > 0): blocks have routed experts
(`maxtext.layers.moe`) in place of the MLP, except the first
`cfg.first_dense_layers`, which are a separate stack (`dense_blocks`, run
first) with a dense MLP. Sown (see below): the sum over layers of the
experts' weighted auxiliary losses as a `moe.AuxLoss` named "aux_loss" (the
train step adds it to the objective), the layers' mean of each unweighted
auxiliary term and of the dropped fraction as `nnx.Intermediate`
"moe_metrics", and each expert layer's expert loads [expert layers,
experts] as `nnx.Intermediate` "expert_load", from which the train step
moves the router bias (`update_router_bias`).

Multi-token prediction (`cfg.mtp_layers` > 0, DeepSeek-V3): `mtp` holds one
`maxtext.models.mtp.MTP` per depth; sown: their logits as `mtp.MtpLogits`
"mtp_logits" (the train step adds their weighted loss to the objective) and,
with experts, their blocks' auxiliary losses as `moe.AuxLoss`
"mtp_aux_loss".

Sowing: the forward pass sows these values (`Module.sow`) only without a
cache and under `nnx.capture`, which hands the caller the types it names
(exactly: naming `nnx.Intermediate` does not collect its subclasses), e.g.
`logits, aux_losses, mtp_logits, stats = nnx.capture(model, moe.AuxLoss,
mtp.MtpLogits, nnx.Intermediate)(tokens)`. Outside a capture the model
sows nothing and skips the prediction depths: flax 0.12.8 deprecates `sow`
outside `nnx.capture` (it would store the values on the module and warn),
and only the train step reads them.

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
from maxtext.layers import mla
from maxtext.layers import mlp
from maxtext.layers import moe
from maxtext.layers import norm
from maxtext.layers import pipeline
from maxtext.layers import remat
from maxtext.layers import rope
from maxtext.layers import vocab_parallel
from maxtext.models import mtp

_RESIDUAL = (axes.BATCH, axes.LENGTH, axes.EMBED)


def _embed_norm(cfg: ModelConfig) -> norm.RMSNorm:
  return norm.RMSNorm(cfg.embed_dim, axis_name=axes.EMBED, eps=cfg.norm_eps,
                      offset=cfg.norm_offset, param_dtype=cfg.param_dtype)


class Block(nnx.Module):
  """Pre-norm residual block: attention then gated MLP or experts (optional
  post-norms)."""

  def __init__(self, cfg: ModelConfig, *, experts: bool = False,
               rngs: nnx.Rngs):
    self.pre_attention_norm = _embed_norm(cfg)
    attention_class = mla.MLA if cfg.attention_type == "mla" else (
        attention.Attention)
    self.attention = attention_class(cfg, rngs=rngs)
    self.post_attention_norm = _embed_norm(cfg) if cfg.post_norms else None
    self.pre_mlp_norm = _embed_norm(cfg)
    self.mlp = None if experts else mlp.MLP(cfg, rngs=rngs)
    self.moe = moe.MoE(cfg, rngs=rngs) if experts else None
    self.post_mlp_norm = _embed_norm(cfg) if cfg.post_norms else None

  def __call__(self, x_BLD: jax.Array, rotary: rope.Rotary, *,
               window: int | None,
               segment_ids_BL: jax.Array | None,
               cache: kv_cache_lib.KVCache | None = None,
               positions_BL: jax.Array | None = None):
    """Returns (new residual stream, cache or None, moe aux dict or None)."""
    h_BLD = self.attention(self.pre_attention_norm(x_BLD), rotary,
                           window=window, segment_ids_BL=segment_ids_BL,
                           cache=cache, positions_BL=positions_BL)
    if cache is not None:
      h_BLD, cache = h_BLD
    if self.post_attention_norm is not None:
      h_BLD = self.post_attention_norm(h_BLD)
    x_BLD = x_BLD + h_BLD
    aux = None
    if self.moe is None:
      h_BLD = self.mlp(self.pre_mlp_norm(x_BLD))
    else:
      h_BLD, aux = self.moe(self.pre_mlp_norm(x_BLD))
    if self.post_mlp_norm is not None:
      h_BLD = self.post_mlp_norm(h_BLD)
    return x_BLD + h_BLD, cache, aux


def _with_remat(call_block, cfg: ModelConfig):
  """`call_block(block, x_BLD, window) -> (x_BLD, aux)` under
  `cfg.remat_policy`."""
  if cfg.remat_policy == "none":
    return call_block

  def run_block(block: Block, x_BLD: jax.Array, window: int | None):
    graphdef, state = nnx.split(block)

    def apply(state, x_BLD):
      return call_block(nnx.merge(graphdef, state), x_BLD, window)

    # Inside a scan, CSE cannot merge the recomputation; skip its barrier.
    return remat.remat(apply, cfg.remat_policy,
                       prevent_cse=not cfg.scan_layers,
                       custom=cfg.remat_custom)(state, x_BLD)

  return run_block


def _capturing(module: nnx.Module) -> bool:
  """Whether `module` runs under `nnx.capture` (what it sows is collected).

  flax 0.12.8 has no public query: `nnx.capture` gives every module of the
  captured tree a `__captures__` attribute for the call. Should a flax
  release change that, nothing is sown and decoder_test's
  `test_sows_only_under_capture` and moe_train_step_test's
  `SowDeprecationTest` fail.
  """
  return hasattr(module, "__captures__")


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
    first = cfg.first_dense_layers
    self.dense_blocks = _make_blocks(cfg, first, False, rngs) if first else None
    self.blocks = _make_blocks(cfg, cfg.num_layers - first,
                               cfg.num_experts > 0, rngs)
    self.final_norm = _embed_norm(cfg)
    if cfg.tie_embeddings:
      self.head = None
    else:
      self.head = linear.Linear(
          (cfg.embed_dim,), (cfg.vocab_size,), in_axes=(axes.EMBED,),
          out_axes=(axes.VOCAB,), dtype=cfg.dtype,
          param_dtype=cfg.param_dtype, rngs=rngs)
    self.mtp = nnx.List([
        mtp.MTP(cfg, Block(cfg, experts=cfg.num_experts > 0, rngs=rngs),
                rngs=rngs) for _ in range(cfg.mtp_layers)
    ]) if cfg.mtp_layers else None

  def init_cache(self, batch: int, length: int):
    """An empty KV cache for `batch` rows of up to `length` positions."""
    cfg = self.cfg

    def empty(_):
      if cfg.attention_type == "mla":  # The compressed latent.
        return mla.empty_cache(cfg, batch, length)
      return kv_cache_lib.KVCache.zeros(batch, length, cfg.num_kv_heads,
                                        cfg.head_dim, jnp.dtype(cfg.dtype))

    def layers(count):
      if cfg.scan_layers:
        return jax.vmap(empty)(jnp.arange(count))
      return tuple(empty(i) for i in range(count))

    first = cfg.first_dense_layers
    if first:  # (dense_blocks' cache, blocks' cache).
      return layers(first), layers(cfg.num_layers - first)
    return layers(cfg.num_layers)

  def __call__(
      self,
      tokens_BL: jax.Array,
      positions_BL: jax.Array | None = None,
      segment_ids_BL: jax.Array | None = None,
      *,
      cache=None,
      page_table_BN: jax.Array | None = None,
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
      page_table_BN: With a paged cache (and only then), int32 [B, N]: row
        b's position t is in page `page_table_BN[b, t // page_size]` of
        every layer.

    Raises:
      ValueError: a paged cache without a page table, or a table without.
    """
    kv_cache_lib.check_page_table(cache, page_table_BN)
    cfg = self.cfg
    sow = cache is None and _capturing(self)
    if positions_BL is None:
      positions_BL = jnp.broadcast_to(jnp.arange(tokens_BL.shape[1]),
                                      tokens_BL.shape)
    x_BLD = axes.constrain(self.embedder(tokens_BL), _RESIDUAL)
    windows = cfg.layer_windows()
    if cfg.pipeline_stages > 1 and cache is None:
      x_BLD = self._pipeline_blocks(x_BLD, positions_BL, segment_ids_BL,
                                    windows)
    else:
      run_block = _block_runner(cfg, positions_BL, segment_ids_BL,
                                cached=cache is not None,
                                page_table_BN=page_table_BN)
      first = cfg.first_dense_layers
      if first:
        dense_cache = None if cache is None else cache[0]
        x_BLD, dense_cache, _ = self._run_blocks(
            self.dense_blocks, x_BLD, windows[:first], dense_cache, run_block)
        cache = None if cache is None else cache[1]
      x_BLD, cache, aux = self._run_blocks(self.blocks, x_BLD,
                                           windows[first:], cache, run_block)
      if first and cache is not None:
        cache = (dense_cache, cache)
      if aux is not None and sow:
        self._sow_moe(aux)
    x_BLD = self.final_norm(x_BLD)
    logits_BLV = self._logits(x_BLD)
    if self.mtp is not None and sow:
      self._sow_mtp(tokens_BL, x_BLD, positions_BL, segment_ids_BL)
    return logits_BLV if cache is None else (logits_BLV, cache)

  def _logits(self, x_BLD: jax.Array) -> jax.Array:
    """float32 logits [B, L, V] of final-normalised states."""
    if self.head is None:
      kernel, names, dtype = (self.embedder.embedding[...],
                              (axes.VOCAB, axes.EMBED), self.embedder.dtype)
    else:
      kernel, names, dtype = (self.head.kernel[...],
                              (axes.EMBED, axes.VOCAB), self.head.dtype)
    logits_BLV = None
    # Not under qwix: it intercepts the head's own matmul (QAT, LoRA) or
    # replaces its kernel (PTQ). A model it quantized or adapted has a class
    # of its making, marked `_unquantized_type` (qwix has no public query).
    if (not hasattr(type(self), "_unquantized_type") and
        isinstance(kernel, jax.Array)):
      logits_BLV = vocab_parallel.logits(x_BLD.astype(dtype),
                                         kernel.astype(dtype), names)
    if logits_BLV is None:
      if self.head is None:
        logits_BLV = self.embedder.attend(x_BLD)
      else:
        logits_BLV = self.head(x_BLD)
      logits_BLV = axes.constrain(logits_BLV,
                                  (axes.BATCH, axes.LENGTH, axes.VOCAB))
    logits_BLV = logits_BLV.astype(jnp.float32)
    if self.cfg.final_logit_softcap:
      cap = self.cfg.final_logit_softcap
      logits_BLV = cap * jnp.tanh(logits_BLV / cap)
    return logits_BLV

  def _sow_mtp(self, tokens_BL, h_BLD, positions_BL, segment_ids_BL):
    """Sows each prediction depth's logits (`mtp.MtpLogits` "mtp_logits")
    and, with experts, their blocks' weighted auxiliary losses
    (`moe.AuxLoss` "mtp_aux_loss")."""
    cfg = self.cfg
    rotary = rope.Rotary.at(positions_BL,
                            rope.global_inverse_frequencies(cfg),
                            rope.global_attention_factor(cfg))
    logits, auxes = mtp.predict(self.mtp, tokens_BL, h_BLD, rotary,
                                segment_ids_BL, self.embedder, self._logits)
    self.sow(mtp.MtpLogits, "mtp_logits", tuple(logits),
             reduce_fn=lambda _, new: new)
    if auxes[0] is not None:
      self.sow(moe.AuxLoss, "mtp_aux_loss",
               sum(aux["loss"] for aux in auxes),
               reduce_fn=lambda _, new: new)

  def _sow_moe(self, aux):
    """Sows the experts' auxiliary losses (each aux value is [layers, ...])."""
    self.sow(moe.AuxLoss, "aux_loss", jnp.sum(aux.pop("loss")),
             reduce_fn=lambda _, new: new)
    self.sow(nnx.Intermediate, "expert_load", aux.pop("expert_load"),
             reduce_fn=lambda _, new: new)
    self.sow(nnx.Intermediate, "moe_metrics",
             {name: jnp.mean(value) for name, value in aux.items()},
             reduce_fn=lambda _, new: new)

  def update_router_bias(self, expert_load_NE: jax.Array) -> None:
    """Moves the experts' router bias against `expert_load_NE` (in place).

    Args:
      expert_load_NE: Each expert layer's loads, as sown ("expert_load",
        [expert layers, experts]). A no-op without router bias or with
        `cfg.router_bias_update_rate` 0.
    """
    rate = self.cfg.router_bias_update_rate
    if not (self.cfg.router_bias and rate):
      return
    if self.cfg.scan_layers:
      bias = self.blocks.moe.router_bias
      bias[...] = moe.update_router_bias(bias[...], expert_load_NE, rate)
      return
    for block, load_E in zip(self.blocks, expert_load_NE, strict=True):
      bias = block.moe.router_bias
      bias[...] = moe.update_router_bias(bias[...], load_E, rate)

  def _run_blocks(self, blocks, x_BLD, windows, cache, run_block):
    """`blocks` in order; returns (x_BLD, new cache or None, aux).

    aux: None for dense blocks, else each MoE aux value stacked over layers.
    """
    if self.cfg.scan_layers:
      return _scan_blocks(*nnx.split(blocks), x_BLD, windows, run_block,
                          cache)
    layer_caches = cache or (None,) * len(windows)
    new_caches, auxes = [], []
    for block, window, layer_cache in zip(blocks, windows, layer_caches):
      x_BLD, layer_cache, aux = run_block(block, x_BLD, window, layer_cache)
      new_caches.append(layer_cache)
      auxes.append(aux)
    return (x_BLD, None if cache is None else tuple(new_caches),
            jax.tree.map(lambda *a: jnp.stack(a), *auxes))

  def _pipeline_blocks(self, x_BLD, positions_BL, segment_ids_BL, windows):
    """The stacked blocks as a pipeline of `cfg.pipeline_stages` stages,
    each passed `cfg.pipeline_repeats` times (`pipeline.circular`)."""
    cfg = self.cfg
    stages, repeats = cfg.pipeline_stages, cfg.pipeline_repeats
    chunk = cfg.num_layers // (stages * repeats)
    graphdef, stacked = nnx.split(self.blocks)
    stage_state = _chunks_by_stage(stacked, stages, repeats)
    chunk_windows = windows[:chunk]
    distinct = tuple(dict.fromkeys(windows))
    if windows == chunk_windows * (stages * repeats):
      kinds_SRC = None  # Every chunk has the same pattern: static windows.
    else:
      # Each layer's window as data: an index into the distinct windows.
      kinds_SRC = jnp.asarray(
          [distinct.index(w) for w in windows], jnp.int32
      ).reshape(repeats, stages, chunk).swapaxes(0, 1)

    def stage_fn(params, microbatch):
      state, kinds_C = params
      x_BLD, positions_BL, segment_ids_BL = microbatch
      run_block = _block_runner(cfg, positions_BL, segment_ids_BL,
                                cached=False)
      if kinds_C is None:
        x_BLD, _, _ = _scan_blocks(graphdef, state, x_BLD, chunk_windows,
                                   run_block, None)
      else:
        def layer_step(x_BLD, layer):
          layer_state, kind = layer
          return _switch_window(run_block, nnx.merge(graphdef, layer_state),
                                x_BLD, distinct, kind), None

        x_BLD, _ = jax.lax.scan(layer_step, x_BLD, (state, kinds_C))
      return x_BLD, positions_BL, segment_ids_BL

    microbatches = cfg.pipeline_microbatches or stages
    inputs = pipeline.split_microbatches(
        (x_BLD, positions_BL, segment_ids_BL), microbatches)
    row_names = (axes.BATCH, axes.LENGTH)
    x_BLD, _, _ = pipeline.merge_microbatches(pipeline.circular(
        stage_fn, (stage_state, kinds_SRC), inputs,
        names=(_RESIDUAL, row_names,
               None if segment_ids_BL is None else row_names)))
    return axes.constrain(x_BLD, _RESIDUAL)


def _chunks_by_stage(stacked, stages: int, repeats: int):
  """Stacked layer state [L, ...] as [S, R, C, ...]: layer (r S + s) C + l
  at [s, r, l], stage s's chunk for pass r.

  Both ends keep the parameter layout (S over `stage`) under
  `axes.activation_sharding`, so XLA moves each stage's chunks to it, and
  their gradients back, with one all-to-all (without the first constraint
  the gradients come back all-gathered) and the schedule's loop never moves
  weights. Free for R = 1.
  """
  rules = axes.current_constrainer()

  def layout(a, names):
    if rules is None:
      return a
    return jax.lax.with_sharding_constraint(
        a, rules.param_sharding(names, a.shape))

  def to_stages(a, names):
    names = tuple(names)
    a_RSC = layout(a, names).reshape(repeats, stages, -1, *a.shape[1:])
    return layout(a_RSC.swapaxes(0, 1), (axes.LAYERS, None, None, *names[1:]))

  # Under `nnx.capture` the blocks also hold the capture's (empty)
  # intermediates, which have no partition spec: they stay as they are.
  captures, stacked = nnx.split_state(stacked, nnx.Intermediate, ...)
  return nnx.merge_state(captures, jax.tree.map(
      to_stages, stacked, nnx.get_partition_spec(stacked),
      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)))


def _switch_window(run_block, block, x_BLD, windows, kind):
  """`block` on `x_BLD` with window `windows[kind]`, `kind` traced.

  Each window is a static branch (its kernel and rotary); under the
  pipeline's vmap over stages `kind` differs per stage, so every branch is
  computed and the stage's own selected.
  """
  branches = [lambda x_BLD, window=window: run_block(block, x_BLD, window,
                                                     None)[0]
              for window in windows]
  return jax.lax.switch(kind, branches, x_BLD)


def _block_runner(cfg: ModelConfig, positions_BL: jax.Array,
                  segment_ids_BL: jax.Array | None, *, cached: bool,
                  page_table_BN: jax.Array | None = None):
  """`run_block(block, x_BLD, window, layer_cache) -> (x_BLD, layer_cache,
  aux)`, aux the block's MoE aux dict or None.

  With `cached`, each block reads and writes its layer's KV cache at
  `positions_BL` (a `PagedKVCache` through `page_table_BN`, which every
  layer shares); otherwise `layer_cache` is None and each block runs under
  `cfg.remat_policy`.
  """
  global_rotary = rope.Rotary.at(positions_BL,
                                 rope.global_inverse_frequencies(cfg),
                                 rope.global_attention_factor(cfg))
  if cfg.rope_local_theta is None:  # Local layers share the global rotary.
    local_rotary = global_rotary
  else:
    local_rotary = rope.Rotary.at(positions_BL,
                                  rope.local_inverse_frequencies(cfg))

  if cached:
    def run_block(block, x_BLD, window, layer_cache):
      rotary = global_rotary if window is None else local_rotary
      if page_table_BN is not None:
        layer_cache = kv_cache_lib.PagedView(layer_cache, page_table_BN)
      x_BLD, layer_cache, aux = block(x_BLD, rotary, window=window,
                                      segment_ids_BL=segment_ids_BL,
                                      cache=layer_cache,
                                      positions_BL=positions_BL)
      if page_table_BN is not None:
        layer_cache = layer_cache.pages
      return axes.constrain(x_BLD, _RESIDUAL), layer_cache, aux
    return run_block

  def call_block(block: Block, x_BLD: jax.Array, window: int | None):
    rotary = global_rotary if window is None else local_rotary
    x_BLD, _, aux = block(x_BLD, rotary, window=window,
                          segment_ids_BL=segment_ids_BL)
    return axes.constrain(x_BLD, _RESIDUAL), aux

  remat_block = _with_remat(call_block, cfg)

  def run_remat_block(block, x_BLD, window, layer_cache):
    del layer_cache  # None.
    x_BLD, aux = remat_block(block, x_BLD, window)
    return x_BLD, None, aux
  return run_remat_block


def _make_blocks(cfg: ModelConfig, count: int, experts: bool,
                 rngs: nnx.Rngs):
  """`count` blocks: stacked over layers (scan_layers) or an `nnx.List`."""
  if not cfg.scan_layers:
    return nnx.List([Block(cfg, experts=experts, rngs=rngs)
                     for _ in range(count)])

  @nnx.split_rngs(splits=count)
  @nnx.vmap(axis_size=count,
            transform_metadata={nnx.PARTITION_NAME: axes.LAYERS})
  def stacked_blocks(rngs: nnx.Rngs) -> Block:
    return Block(cfg, experts=experts, rngs=rngs)

  return stacked_blocks(rngs)


def _scan_blocks(graphdef, stacked, x_BLD, windows, run_block, cache):
  """Runs stacked blocks: a scan over pattern groups, then the rest.

  `stacked` is the blocks' state with a leading layer axis, `windows` their
  windows; `cache` (stacked over layers, or None) is scanned alongside the
  parameters. Returns (x_BLD, new cache or None, aux stacked over layers
  or None).
  """
  period = pattern_period(windows)
  num_groups = len(windows) // period

  def at(tree, index):
    return jax.tree.map(lambda a: a[index], tree)

  def layer(state, index):
    return nnx.merge(graphdef, at(state, index))

  def stack(caches):
    return jax.tree.map(lambda *a: jnp.stack(a), *caches)

  def group_step(x_BLD, group):
    caches, auxes = [], []
    for offset, (layer_state, layer_cache) in enumerate(group):
      x_BLD, layer_cache, aux = run_block(nnx.merge(graphdef, layer_state),
                                          x_BLD, windows[offset],
                                          layer_cache)
      caches.append(layer_cache)
      auxes.append(aux)
    return x_BLD, (stack(caches), stack(auxes))

  def strided(tree, offset):
    return jax.tree.map(lambda a: a[offset:num_groups * period:period], tree)

  # The scan hands each layer its parameters unsliced ([num_groups, ...] per
  # offset in the group): autodiff then keeps them as residuals by reference
  # instead of stacking a copy of every weight in the forward pass.
  x_BLD, scanned = jax.lax.scan(
      group_step, x_BLD,
      tuple(strided((stacked, cache), offset) for offset in range(period)))
  outputs = [jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), scanned)]
  for index in range(num_groups * period, len(windows)):
    x_BLD, layer_cache, aux = run_block(layer(stacked, index), x_BLD,
                                        windows[index], at(cache, index))
    outputs.append(jax.tree.map(lambda a: a[None], (layer_cache, aux)))
  cache, aux = jax.tree.map(lambda *a: jnp.concatenate(a), *outputs)
  return x_BLD, cache, aux
