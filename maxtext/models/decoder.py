"""The generic dense decoder: embed -> blocks -> final norm -> output head.

Every dense family is this model with a different `ModelConfig`.

Layer kinds (`maxtext.common.layer_pattern`): the layers are a pattern of
kinds (a dense MLP, routed experts, global attention with its own head
size), each kind with its own parameter stack, the attribute named after it
(`blocks`, `dense_blocks`, `global_blocks`, ...); a layer's place in its
kind's stack is `layer_pattern.slots`. A layer's attention window is not a
kind: Gemma 3's local and global layers share one stack.

Layouts of each kind's parameters:
  scan_layers=True: one `Block` whose parameters are stacked over the
    kind's layers (leading axis, logical name "layers"), built with
    `nnx.vmap`. The forward pass runs the layers in order as the runs of
    `layer_pattern.segments`, each a pattern of layers (kinds and windows,
    e.g. Gemma 3's 5 local + 1 global) repeated over groups, scanned over
    its groups with one group traced; so compile time grows with the
    pattern length, not with depth. Each layer of a group gets its kind's
    stack sliced with a stride, unsliced by the scan.
  scan_layers=False: an `nnx.List` of `Block`s per kind, one per layer.

Per-layer inputs (`cfg.per_layer_input_dim` P > 0, Gemma 4 e2b and e4b):
before the layers, each token gets an input of its own for every layer,
[layers, B, L, P]: `per_layer_embedder` (num_layers * P wide, times
sqrt(P)) plus `per_layer_projection` of the embedded tokens (times
embed_dim^-1/2, RMS-normalised over P by `per_layer_norm`), the sum times
2^-1/2; each block mixes its own into the stream (`maxtext.models.block`).

Layers that share keys and values (`cfg.pattern.kv_shared_layers`: a
layer kind without key and value projections) attend over those of the last
earlier layer of their span, which `stores_kv` (`layer_stack.run_layers`);
with a KV cache they read that layer's cache and have none of their own.

Vision-language models (`cfg.vision.layers` > 0, Gemma 3 4b/12b/27b,
Llama 4): a vision tower and a projector (`maxtext.layers.vision`: `vision`
and `projector`) turn each row's images (Llama 4: image tiles) into soft
tokens that replace the row's `image_token_id` placeholders, in order,
after the token embedding; with Gemma 3's tower the tokens of one image
attend to each other bidirectionally (an explicit mask for the kernel), the
rest causally. `image_embeddings` is the tower
and projector alone.

How the model runs, apart from what it is (`maxtext.models.execution`:
attention kernel, pipeline, remat), comes as `execution=`; it changes
neither the parameters nor the outputs.

Pipeline parallelism (`execution.pipeline.stages` = g > 1, training only,
no experts): each kind's stacked layers are cut into g * r chunks (r =
`pipeline.repeats`) viewed as [g, r, layers per chunk], chunk i g + s at
[s, i], and run as a GPipe (r = 1) or circular (r > 1) schedule over
`pipeline.microbatches` slices of the batch (`maxtext.layers.pipeline`);
each row's positions and segment ids travel with it through the stages. The
leading "layers" axis is sharded over the `stage` mesh axis in contiguous
blocks, so for R = 1 the view is free; for R > 1 it moves each stage's chunks
to it once per call (an all-to-all over `stage`, outside the schedule's loop).
When every chunk has the same layers (kinds and windows), a chunk runs as
above, each kind from its own stack; a model of several kinds needs that.
Otherwise (one kind) each layer's window is data indexed by stage and pass, and the layer
switches between the distinct windows (under the vmap over stages every branch
is computed, so such layers cost about one block per distinct window: prefer
stage and repeat counts that give every chunk the same pattern). With a KV
cache (decoding) the layers run without the pipeline.

Each block runs under `execution.remat` (`maxtext.layers.remat`). The residual
stream is constrained to the logical axes (batch, length, embed) at every
block boundary and the logits to (batch, length, vocab); the constraints apply
only under `axes.activation_sharding` (the train step sets it from the compute
rules).

Decoding: `init_cache(batch, length)` gives an empty KV cache, a dict by
layer kind (each kind's stacked over its layers with scan_layers, a tuple
of per-layer caches without; a kind's heads and head size are its own);
`model(tokens, positions, cache=cache)` runs the tokens (a prompt, then one
token per step) through the same blocks, writing their keys and values at
their positions, and returns (logits, cache). Without a cache nothing
changes. A paged cache (`kv_cache.paged_like`: pages only) comes with
`page_table_BN=`, one table for every layer: each layer's attention reads
its pages through it, and the layer scan closes over it rather than
carrying a copy per layer.

Mixture of experts (`cfg.moe.num_experts` > 0): blocks have routed experts
(`maxtext.layers.moe`) in place of the MLP, except the first
`cfg.pattern.first_dense_layers` and those between
`cfg.pattern.moe_layer_interval`, which are a kind of their own (`dense_blocks`) with a dense MLP. Sown (see below): the
sum over layers of the experts' weighted auxiliary losses as a `moe.AuxLoss`
named "aux_loss" (the train step adds it to the objective), the layers' mean of
each unweighted auxiliary term and of the dropped fraction as
`nnx.Intermediate` "moe_metrics", and each expert layer's expert loads [expert
layers, experts] (kind by kind, each in its stack's order) as
`nnx.Intermediate` "expert_load", from which the train step moves the router
bias (`update_router_bias`).

Multi-token prediction (`cfg.mtp.layers` > 0, DeepSeek-V3): `mtp` holds one
`maxtext.models.mtp.MTP` per depth; sown: their logits as `mtp.MtpLogits`
"mtp_logits" (the train step adds their weighted loss to the objective) and,
with experts or an indexer, their blocks' auxiliary losses (the experts'
and the indexer's) as `moe.AuxLoss` "mtp_aux_loss".

DeepSeek Sparse Attention (`cfg.mla.index_topk` > 0): sown, the sum over
layers of each indexer's loss (`maxtext.layers.mla`) as a `moe.AuxLoss`
"indexer_loss" (the train step adds it to the objective and logs it as
`train/indexer_loss`).

Sowing: the forward pass sows these values (`Module.sow`) only without a
cache and under `nnx.capture`, which hands the caller the types it names
(exactly: naming `nnx.Intermediate` does not collect its subclasses), e.g.
`logits, aux_losses, mtp_logits, stats = nnx.capture(model, moe.AuxLoss,
mtp.MtpLogits, nnx.Intermediate)(tokens)`. Outside a capture the model
sows nothing and skips the prediction depths: flax 0.12.8 deprecates `sow`
outside `nnx.capture` (it would store the values on the module and warn),
and only the train step reads them.

The code is split by concern: a layer (`Block`) and how one runs
(`maxtext.models.block`), a stack of layers scanned or pipelined
(`maxtext.models.layer_stack`), and here the model around them.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.common import axes
from maxtext.common import layer_pattern
from maxtext.common.model_config import ModelConfig
from maxtext.layers import embedding
from maxtext.layers import gated_deltanet
from maxtext.layers import kv_cache as kv_cache_lib
from maxtext.layers import linear
from maxtext.layers import mla
from maxtext.layers import moe
from maxtext.layers import vision
from maxtext.layers import vocab_parallel
from maxtext.models import block as block_lib
from maxtext.models import execution as execution_lib
from maxtext.models import layer_stack
from maxtext.models import mtp


def _capturing(module: nnx.Module) -> bool:
  """Whether `module` runs under `nnx.capture` (what it sows is collected).

  flax 0.12.8 has no public query: `nnx.capture` gives every module of the
  captured tree a `__captures__` attribute for the call. Should a flax
  release change that, nothing is sown and decoder_test's
  `test_sows_only_under_capture` and moe_train_step_test's
  `SowDeprecationTest` fail.
  """
  return hasattr(module, "__captures__")


class Decoder(nnx.Module):
  """Decoder-only transformer returning float32 logits [B, L, V]."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs,
               execution: execution_lib.Execution = execution_lib.Execution()):
    """Raises ValueError when `cfg` cannot run under `execution`."""
    execution.check(cfg)
    self.cfg = cfg
    self.execution = execution
    self.embedder = embedding.Embedder(
        cfg.vocab_size, cfg.embed_dim, scale_by_sqrt_dim=cfg.scale_embeddings,
        dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
    self.pattern = layer_pattern.layers(cfg)
    for kind, count in layer_pattern.kind_counts(cfg).items():  # A stack each.
      setattr(self, kind.name,
              layer_stack.make_blocks(cfg, kind, count,
                                      execution.attention_kernel, rngs))
    width = cfg.per_layer_input_dim
    dtypes = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, rngs=rngs)
    self.per_layer_embedder = embedding.Embedder(
        cfg.vocab_size, cfg.num_layers * width, scale_by_sqrt_dim=False,
        multiplier=width**0.5, **dtypes) if width else None
    self.per_layer_projection = linear.Linear(
        (cfg.embed_dim,), (cfg.num_layers, width), in_axes=(axes.EMBED,),
        out_axes=(None, None), **dtypes) if width else None
    self.per_layer_norm = cfg.norm.rms_norm(
        width, axis_name=(None,), param_dtype=cfg.param_dtype) if width else None
    towers = cfg.vision.layers > 0
    self.vision = vision.VisionEncoder(
        cfg.vision, scan_layers=cfg.scan_layers, **dtypes) if towers else None
    projector = (vision.PixelShuffleProjector if cfg.vision.arch == "llama4"
                 else vision.PoolingProjector)
    self.projector = projector(
        cfg.vision, embed_dim=cfg.embed_dim, **dtypes) if towers else None
    self.final_norm = block_lib.embed_norm(cfg)
    if cfg.tie_embeddings:
      self.head = None
    else:
      self.head = linear.Linear(
          (cfg.embed_dim,), (cfg.vocab_size,), in_axes=(axes.EMBED,),
          out_axes=(axes.VOCAB,), dtype=cfg.dtype,
          param_dtype=cfg.param_dtype, rngs=rngs)
    self.mtp = nnx.List([
        mtp.MTP(block_lib.Block(
            cfg, layer_pattern.LayerKind("blocks", cfg.moe.num_experts > 0),
            kernel=execution.attention_kernel, rngs=rngs),
                embed_dim=cfg.embed_dim, norm_config=cfg.norm, dtype=cfg.dtype,
                param_dtype=cfg.param_dtype, rngs=rngs)
        for _ in range(cfg.mtp.layers)
    ]) if cfg.mtp.layers else None

  def _stacks(self) -> dict[str, nnx.Module]:
    """{kind name: its blocks}, in order of the kinds' first layers."""
    return {kind.name: getattr(self, kind.name)
            for kind in layer_pattern.kinds(self.cfg)}

  def init_cache(self, batch: int, length: int):
    """An empty KV cache for `batch` rows of up to `length` positions:
    {kind name: its layers' caches} (None for a kind that shares keys and
    values, each of its layers None without scan_layers; a Gated DeltaNet
    kind's `DeltaNetCache`, whatever the length)."""
    cfg = self.cfg

    def empty(kind_cfg, linear):
      if linear:
        return gated_deltanet.DeltaNetCache.zeros(
            kind_cfg.linear_attention, batch, jnp.dtype(kind_cfg.dtype))
      if kind_cfg.attention.type == "mla":  # The compressed latent.
        return mla.empty_cache(kind_cfg.mla, kind_cfg.attention.head_dim,
                               kind_cfg.dtype, batch, length)
      return kv_cache_lib.KVCache.zeros(
          batch, length, kind_cfg.attention.num_kv_heads,
          kind_cfg.attention.head_dim, jnp.dtype(kind_cfg.dtype))

    caches = {}
    for kind, count in layer_pattern.kind_counts(cfg).items():
      if kind.kv_shared:
        caches[kind.name] = None if cfg.scan_layers else (None,) * count
        continue
      layer = empty(kind.config(cfg), kind.linear)
      caches[kind.name] = (
          jax.tree.map(lambda a, n=count: jnp.broadcast_to(a, (n, *a.shape)),
                       layer)
          if cfg.scan_layers else (layer,) * count)
    return caches

  def __call__(
      self,
      tokens_BL: jax.Array,
      positions_BL: jax.Array | None = None,
      segment_ids_BL: jax.Array | None = None,
      *,
      cache=None,
      page_table_BN: jax.Array | None = None,
      images_Bvhwe: jax.Array | None = None,
      valid_BL: jax.Array | None = None,
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
      images_Bvhwe: With a vision tower, each row's images (preprocessed,
        `maxtext.data.images`), [B, v, h, w, e]: their soft tokens replace
        the row's `image_token_id` placeholders in order (v * u of them,
        `image_embeddings`), and attend to the other tokens of their
        image. With a cache, the images' placeholders must all be among
        these tokens.
      valid_BL: With a cache, which tokens are real (bool [B, L], a prefix
        of each row; None: all): a Gated DeltaNet layer's state skips a
        right-padded prompt's padding, as attention's causal mask does.

    Raises:
      ValueError: a paged cache without a page table, or a table without;
        images for a model without a vision tower or under the pipeline.
    """
    kv_cache_lib.check_page_table(cache, page_table_BN)
    cfg = self.cfg
    sow = cache is None and _capturing(self)
    if positions_BL is None:
      positions_BL = jnp.broadcast_to(jnp.arange(tokens_BL.shape[1]),
                                      tokens_BL.shape)
    x_BLD, image_blocks_BL = self._embed(tokens_BL, images_Bvhwe)
    x_BLD = axes.constrain(x_BLD, block_lib.RESIDUAL)
    if self.execution.pipeline.stages > 1 and cache is None:
      if images_Bvhwe is not None:
        raise ValueError("Images are not supported under the pipeline "
                         "(pipeline.stages > 1).")
      x_BLD = layer_stack.pipeline_blocks(cfg, self.execution,
                                          self._stacks(), x_BLD, positions_BL,
                                          segment_ids_BL, self.pattern)
    else:
      run_block = block_lib.block_runner(cfg, self.pattern, positions_BL,
                                         segment_ids_BL,
                                         cached=cache is not None,
                                         page_table_BN=page_table_BN,
                                         remat_config=self.execution.remat,
                                         image_blocks_BL=image_blocks_BL,
                                         valid_BL=valid_BL, index_loss=sow)
      x_BLD, cache, auxes = layer_stack.run_layers(
          cfg, self._stacks(), self.pattern, x_BLD, run_block, cache,
          self._per_layer_inputs(tokens_BL, x_BLD))
      index_losses = [aux.pop("indexer_loss") for aux in auxes.values()
                      if aux and "indexer_loss" in aux]
      if index_losses:  # Only when sowing.
        self.sow(moe.AuxLoss, "indexer_loss",
                 sum(jnp.sum(losses) for losses in index_losses),
                 reduce_fn=lambda _, new: new)
      expert_auxes = [auxes[name] for name in self._expert_kinds()]
      if expert_auxes and sow:
        self._sow_moe(jax.tree.map(lambda *a: jnp.concatenate(a),
                                   *expert_auxes))
    x_BLD = self.final_norm(x_BLD)
    logits_BLV = self._logits(x_BLD)
    if self.mtp is not None and sow:
      self._sow_mtp(tokens_BL, x_BLD, positions_BL, segment_ids_BL)
    return logits_BLV if cache is None else (logits_BLV, cache)

  def _embed(self, tokens_BL: jax.Array, images_Bvhwe: jax.Array | None):
    """(Embedded tokens [B, L, D] with the images' soft tokens placed, the
    images' blocks [B, L] or None without images)."""
    if images_Bvhwe is None:
      return self.embedder(tokens_BL), None
    if self.vision is None:
      raise ValueError("images given to a model without a vision tower "
                       "(vision_layers=0).")
    is_image_BL = tokens_BL == self.cfg.vision.image_token_id
    # A placeholder id may lie outside the vocabulary; it is replaced anyway.
    x_BLD = self.embedder(jnp.where(is_image_BL, 0, tokens_BL))
    x_BLD = vision.place_soft_tokens(x_BLD, is_image_BL,
                                     self.image_embeddings(images_Bvhwe))
    if not self.cfg.vision.bidirectional_images:
      return x_BLD, None
    return x_BLD, vision.image_blocks(is_image_BL)

  def image_embeddings(self, images_Bvhwe: jax.Array) -> jax.Array:
    """Soft tokens [B, v * u, D] of each row's images, in order."""
    batch, count = images_Bvhwe.shape[:2]
    soft_vuD = self.projector(self.vision(
        images_Bvhwe.reshape(batch * count, *images_Bvhwe.shape[2:])))
    return soft_vuD.reshape(batch, -1, soft_vuD.shape[-1])

  def _per_layer_inputs(self, tokens_BL: jax.Array,
                        x_BLD: jax.Array) -> jax.Array | None:
    """Each layer's own input [layers, B, L, P] (None without), from the
    tokens and their embeddings `x_BLD`."""
    if self.per_layer_embedder is None:
      return None
    batch, length = tokens_BL.shape
    width = self.cfg.per_layer_input_dim
    tokens_BLlP = self.per_layer_embedder(tokens_BL).reshape(
        batch, length, self.cfg.num_layers, width)
    projected_BLlP = self.per_layer_norm(
        self.per_layer_projection(x_BLD) * self.cfg.embed_dim**-0.5)
    inputs_BLlP = (projected_BLlP + tokens_BLlP) * 2**-0.5
    return axes.constrain(jnp.moveaxis(inputs_BLlP, 2, 0),
                          (None, axes.BATCH, axes.LENGTH, None))

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
    and, with experts or an indexer, their blocks' weighted auxiliary
    losses (`moe.AuxLoss` "mtp_aux_loss")."""
    cfg = self.cfg
    rotary = cfg.rope.global_rotary(positions_BL, cfg.attention.head_dim)
    logits, auxes = mtp.predict(self.mtp, tokens_BL, h_BLD, rotary,
                                positions_BL, segment_ids_BL, self.embedder, self._logits)
    self.sow(mtp.MtpLogits, "mtp_logits", tuple(logits),
             reduce_fn=lambda _, new: new)
    if auxes[0] is not None:
      self.sow(moe.AuxLoss, "mtp_aux_loss",
               sum(aux.get("loss", 0.0) + aux.get("indexer_loss", 0.0)
                   for aux in auxes),
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

  def _expert_kinds(self) -> list[str]:
    """Names of the kinds with experts, in the order their MoE values are
    sown (each kind's layers in its stack's order)."""
    return [kind.name for kind in layer_pattern.kinds(self.cfg)
            if kind.experts]

  def update_router_bias(self, expert_load_lE: jax.Array) -> None:
    """Moves the experts' router bias against `expert_load_lE` (in place).

    Args:
      expert_load_lE: Each expert layer's loads, as sown ("expert_load",
        [expert layers, experts]). A no-op without router bias or with
        `cfg.moe.router_bias_update_rate` 0.
    """
    rate = self.cfg.moe.router_bias_update_rate
    if not (self.cfg.moe.router_bias and rate):
      return
    start = 0
    counts = {kind.name: n
              for kind, n in layer_pattern.kind_counts(self.cfg).items()}
    for name in self._expert_kinds():
      blocks = getattr(self, name)
      count = counts[name]
      loads_lE = expert_load_lE[start:start + count]
      start += count
      if self.cfg.scan_layers:
        bias = blocks.moe.router_bias
        bias[...] = moe.update_router_bias(bias[...], loads_lE, rate)
        continue
      for block, load_E in zip(blocks, loads_lE, strict=True):
        bias = block.moe.router_bias
        bias[...] = moe.update_router_bias(bias[...], load_E, rate)
