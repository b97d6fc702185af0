"""A stack of blocks of one kind: built stacked over layers or as a list,
run as a scan over the repeating pattern of sliding windows, or as pipeline
stages (`pipeline_blocks`); see `maxtext.models.decoder` for the layouts.

Shape key: B batch, L length, D embed dim.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.common import axes
from maxtext.common.model_config import ModelConfig
from maxtext.layers import pipeline
from maxtext.models import block as block_lib


def pattern_period(windows: tuple[int | None, ...]) -> int:
  """Smallest p with windows[i] == windows[i % p] for every layer i."""
  for period in range(1, len(windows) + 1):
    if all(w == windows[i % period] for i, w in enumerate(windows)):
      return period
  raise AssertionError("unreachable: the full length is always a period")


def make_blocks(cfg: ModelConfig, count: int, experts: bool,
                 rngs: nnx.Rngs):
  """`count` blocks: stacked over layers (scan_layers) or an `nnx.List`."""
  if not cfg.scan_layers:
    return nnx.List([block_lib.Block(cfg, experts=experts, rngs=rngs)
                     for _ in range(count)])

  @nnx.split_rngs(splits=count)
  @nnx.vmap(axis_size=count,
            transform_metadata={nnx.PARTITION_NAME: axes.LAYERS})
  def stacked_blocks(rngs: nnx.Rngs) -> block_lib.Block:
    return block_lib.Block(cfg, experts=experts, rngs=rngs)

  return stacked_blocks(rngs)


def scan_blocks(graphdef, stacked, x_BLD, windows, run_block, cache):
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


def pipeline_blocks(cfg: ModelConfig, blocks, x_BLD, positions_BL,
                    segment_ids_BL, windows):
  """Stacked `blocks` as a pipeline of `cfg.pipeline_stages` stages, each
  passed `cfg.pipeline_repeats` times (`pipeline.circular`); see the
  module docstring of `maxtext.models.decoder`."""
  stages, repeats = cfg.pipeline_stages, cfg.pipeline_repeats
  chunk = cfg.num_layers // (stages * repeats)
  graphdef, stacked = nnx.split(blocks)
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
    run_block = block_lib.block_runner(cfg, positions_BL, segment_ids_BL,
                                       cached=False)
    if kinds_C is None:
      x_BLD, _, _ = scan_blocks(graphdef, state, x_BLD, chunk_windows,
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
      names=(block_lib.RESIDUAL, row_names,
             None if segment_ids_BL is None else row_names)))
  return axes.constrain(x_BLD, block_lib.RESIDUAL)


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
