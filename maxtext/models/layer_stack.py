"""The decoder's layers: a stack of blocks per layer kind, built stacked
over layers or as a list, run in layer order as scans over the runs of a
repeating pattern (`maxtext.common.layer_pattern`), or as pipeline stages
(`pipeline_blocks`); see `maxtext.models.decoder` for the layouts.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

import collections

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.common import axes
from maxtext.common import layer_pattern
from maxtext.common.model_config import ModelConfig
from maxtext.kernels import dispatch
from maxtext.layers import pipeline
from maxtext.models import block as block_lib
from maxtext.models import execution as execution_lib


def make_blocks(cfg: ModelConfig, kind: layer_pattern.LayerKind, count: int,
                kernel: dispatch.Kernel, rngs: nnx.Rngs):
  """`count` blocks of `kind` attending with `kernel`: stacked over layers
  (scan_layers) or an `nnx.List`."""
  if not cfg.scan_layers:
    return nnx.List([block_lib.Block(cfg, kind, kernel=kernel, rngs=rngs)
                     for _ in range(count)])

  @nnx.split_rngs(splits=count)
  @nnx.vmap(axis_size=count,
            transform_metadata={nnx.PARTITION_NAME: axes.LAYERS})
  def stacked_blocks(rngs: nnx.Rngs) -> block_lib.Block:
    return block_lib.Block(cfg, kind, kernel=kernel, rngs=rngs)

  return stacked_blocks(rngs)


def run_layers(cfg: ModelConfig, stacks, pattern, x_BLD, run_block, caches,
               per_layer_lBLP: jax.Array | None = None):
  """Runs the layers of `pattern` in order, each on its kind's stack.

  `stacks` maps each kind's name to its blocks (`make_blocks`); `caches`
  (None, or the same keys: each kind's cache, stacked over its layers with
  scan_layers, else a tuple; None entries for kinds that share keys and
  values) goes alongside. `per_layer_lBLP`: each layer's own input
  (`ModelConfig.per_layer_input_dim`), layers first. Stacked blocks run as a
  scan over each run of `layer_pattern.segments`. Returns (x_BLD, the new
  caches or None, {kind name: each MoE aux value stacked over the kind's
  layers, or None}).

  A layer that `stores_kv` hands its keys and values (with a cache: its
  written cache) to the later layers of its span that share them.
  """
  if cfg.scan_layers:
    split = {name: nnx.split(stack) for name, stack in stacks.items()}
    return scan_layers({name: g for name, (g, _) in split.items()},
                       {name: s for name, (_, s) in split.items()},
                       pattern, x_BLD, run_block, caches, per_layer_lBLP)
  outputs = {name: [] for name in stacks}
  shared = {}
  for index, (layer, slot) in enumerate(zip(pattern,
                                            layer_pattern.slots(pattern))):
    name = layer.kind.name
    layer_cache, inputs = _layer_inputs(
        layer, None if caches is None else caches[name][slot],
        None if per_layer_lBLP is None else per_layer_lBLP[index], shared,
        cached=caches is not None)
    x_BLD, layer_cache, aux, kv = run_block(stacks[name][slot], x_BLD, layer,
                                            layer_cache, inputs)
    layer_cache = _keep_kv(layer, layer_cache, kv, shared)
    outputs[name].append((layer_cache, aux))
  new_caches = {name: tuple(c for c, _ in out) for name, out in outputs.items()}
  auxes = {name: _stack([aux for _, aux in out])
           for name, out in outputs.items()}
  return x_BLD, None if caches is None else new_caches, auxes


def _layer_inputs(layer: layer_pattern.Layer, layer_cache, per_layer_BLP,
                  shared, cached: bool):
  """(The cache `layer` runs with, its `block_lib.LayerInputs`): a layer
  that shares keys and values reads those stored in `shared` by span
  (without a cache), or the cache of the layer that stores them."""
  kv = None
  if layer.kind.kv_shared:
    if cached:
      layer_cache = shared[layer.span]
    else:
      kv = shared[layer.span]
  return layer_cache, block_lib.LayerInputs(per_layer_BLP, kv)


def _keep_kv(layer: layer_pattern.Layer, layer_cache, kv, shared):
  """Stores a layer's keys and values (`kv`, or with a cache its written
  `layer_cache`) in `shared` when it `stores_kv`; returns the cache the
  layer keeps (none for a layer that shares another's)."""
  if layer.stores_kv:
    shared[layer.span] = layer_cache if kv is None else kv
  return None if layer.kind.kv_shared else layer_cache


def _stack(trees):
  return jax.tree.map(lambda *a: jnp.stack(a), *trees)


def scan_layers(graphdefs, states, pattern, x_BLD, run_block, caches,
                per_layer_lBLP=None):
  """`run_layers` on stacked blocks: `graphdefs` and `states` map each kind
  to its blocks' graph and state (leading layer axis)."""
  slots = layer_pattern.slots(pattern)
  pieces = {name: [] for name in states}  # (cache, aux) [layers, ...] runs.
  shared = {}  # Keys and values (or caches) stored by span, for later runs.
  for segment in layer_pattern.segments(pattern):
    layers = pattern[segment.start:segment.start + segment.period]
    per_group = collections.Counter(layer.kind.name for layer in layers)

    # Each layer's place among its kind's layers of a group.
    ranks, seen = [], collections.Counter()
    for layer in layers:
      ranks.append(seen[layer.kind.name])
      seen[layer.kind.name] += 1

    def grouped(tree, name, segment=segment, layers=layers):
      # The kind's layers of this run, [groups, per group, ...]: they are a
      # contiguous run of its stack, reshaped (not strided slices, whose
      # gradients libtpu fails to compile: docs/aot_compile.md).
      per_kind = per_group[name]
      first = slots[segment.start + next(
          i for i, layer in enumerate(layers) if layer.kind.name == name)]
      return jax.tree.map(
          lambda a: a[first:first + per_kind * segment.groups].reshape(
              segment.groups, per_kind, *a.shape[1:]), tree)

    def group_step(x_BLD, xs, layers=layers, ranks=ranks, outer=shared):
      group, per_layer_pBLP = xs
      stored = dict(outer)  # A layer of this group may store for a later.
      outputs = []
      for i, (layer, rank) in enumerate(zip(layers, ranks)):
        group_state, group_cache = group[layer.kind.name]
        layer_cache, inputs = _layer_inputs(
            layer, jax.tree.map(lambda a, r=rank: a[r], group_cache),
            None if per_layer_pBLP is None else per_layer_pBLP[i], stored,
            cached=caches is not None)
        # The block indexes its group's parameters itself (`rank`), inside
        # its remat: autodiff keeps the scan's slice as a residual by
        # reference instead of stacking a copy of every weight.
        x_BLD, layer_cache, aux, kv = run_block(
            nnx.merge(graphdefs[layer.kind.name], group_state), x_BLD, layer,
            layer_cache, inputs, rank=rank)
        outputs.append((_keep_kv(layer, layer_cache, kv, stored), aux))
      mine = tuple(stored[layer.span] for layer in layers if layer.stores_kv)
      return x_BLD, (tuple(outputs), mine)

    # The scan hands each kind its parameters unsliced ([groups, ...]).
    group_inputs = {
        name: grouped((states[name],
                       None if caches is None else caches[name]), name)
        for name in per_group}
    per_layer = None
    if per_layer_lBLP is not None:
      end = segment.start + segment.period * segment.groups
      per_layer = per_layer_lBLP[segment.start:end].reshape(
          segment.groups, segment.period, *per_layer_lBLP.shape[1:])
    x_BLD, (outputs, stored) = jax.lax.scan(group_step, x_BLD,
                                            (group_inputs, per_layer))
    # A layer that stores keys and values is the only one of its kind and
    # span, so its run has one group.
    spans = [layer.span for layer in layers if layer.stores_kv]
    shared.update({span: jax.tree.map(lambda a: a[-1], value)
                   for span, value in zip(spans, stored, strict=True)})
    for name in per_group:
      # The kind's offsets, [groups, ...] each, interleave into its layers
      # of the run in order.
      mine = [out for out, layer in zip(outputs, layers)
              if layer.kind.name == name]
      pieces[name].append(jax.tree.map(
          lambda *a: jnp.stack(a, axis=1).reshape(-1, *a[0].shape[1:]),
          *mine))
  joined = {name: jax.tree.map(lambda *a: jnp.concatenate(a), *runs)
            for name, runs in pieces.items()}
  new_caches = {name: cache for name, (cache, _) in joined.items()}
  auxes = {name: aux for name, (_, aux) in joined.items()}
  return x_BLD, None if caches is None else new_caches, auxes


def pipeline_blocks(cfg: ModelConfig, execution: execution_lib.Execution,
                    stacks, x_BLD, positions_BL, segment_ids_BL, pattern):
  """The stacked blocks of every kind (`stacks`: kind name -> blocks) as a
  pipeline of `execution.pipeline.stages` stages, each passed `.repeats`
  times (`pipeline.circular`), blocks under `execution.remat`; see the
  module docstring of `maxtext.models.decoder`.

  Each kind's stack is cut into the chunks in layer order. With one kind the
  chunks may differ in windows (each layer's window is then data); with
  several, every chunk holds the same layers (`Execution.check`).
  """
  stages = execution.pipeline.stages
  repeats = execution.pipeline.repeats
  chunk = cfg.num_layers // (stages * repeats)
  split = {name: nnx.split(stack) for name, stack in stacks.items()}
  graphdefs = {name: graphdef for name, (graphdef, _) in split.items()}
  stage_states = {name: pipeline.stage_chunks(stacked, stages, repeats)
                  for name, (_, stacked) in split.items()}
  chunk_pattern = pattern[:chunk]
  distinct = tuple(dict.fromkeys(pattern))
  if pattern == chunk_pattern * (stages * repeats):
    layer_ids_grl = None  # Every chunk has the same pattern: static layers.
  else:
    # One kind; each layer (its window) as data: an index into the distinct
    # layers.
    layer_ids_grl = jnp.asarray(
        [distinct.index(layer) for layer in pattern], jnp.int32
    ).reshape(repeats, stages, chunk).swapaxes(0, 1)

  def stage_fn(params, microbatch):
    states, layer_ids_l = params
    x_BLD, positions_BL, segment_ids_BL = microbatch
    run_block = block_lib.block_runner(cfg, distinct, positions_BL,
                                       segment_ids_BL, cached=False,
                                       remat_config=execution.remat)
    if layer_ids_l is None:
      x_BLD, _, _ = scan_layers(graphdefs, states, chunk_pattern, x_BLD,
                                run_block, None)
    else:
      (name, graphdef), = graphdefs.items()

      def layer_step(x_BLD, layer):
        layer_state, layer_id = layer
        return _switch_layer(run_block, nnx.merge(graphdef, layer_state),
                             x_BLD, distinct, layer_id), None

      x_BLD, _ = jax.lax.scan(layer_step, x_BLD, (states[name], layer_ids_l))
    return x_BLD, positions_BL, segment_ids_BL

  microbatches = execution.pipeline.microbatches or stages
  inputs = pipeline.split_microbatches(
      (x_BLD, positions_BL, segment_ids_BL), microbatches)
  row_names = (axes.BATCH, axes.LENGTH)
  x_BLD, _, _ = pipeline.merge_microbatches(pipeline.circular(
      stage_fn, (stage_states, layer_ids_grl), inputs,
      names=(block_lib.RESIDUAL, row_names,
             None if segment_ids_BL is None else row_names)))
  return axes.constrain(x_BLD, block_lib.RESIDUAL)


def _switch_layer(run_block, block, x_BLD, layers, layer_id):
  """`block` on `x_BLD` as layer `layers[layer_id]`, `layer_id` traced.

  Each layer (window) is a static branch (its kernel and rotary); under the
  pipeline's vmap over stages `layer_id` differs per stage, so every branch
  is computed and the stage's own selected.
  """
  branches = [lambda x_BLD, layer=layer: run_block(
      block, x_BLD, layer, None, block_lib.LayerInputs())[0]
              for layer in layers]
  return jax.lax.switch(layer_id, branches, x_BLD)
