"""Pipeline parallelism: GPipe and circular schedules over `stage`, plain JAX.

The layers are split into g * r consecutive chunks (g stages, r repeats)
and the batch into M microbatches. Stage s holds chunks s, s + g, ...,
s + (r - 1) g: their parameters are stacked as [g, r, ...], the stage axis
sharded over the `stage` mesh axis. A microbatch passes through the stages r
times ("circular" or interleaved schedule, as in praxis and MaxText); r = 1
is GPipe, each stage holding one chunk of consecutive layers.

Work items k = 0 .. r M - 1 enter stage 0 in order: item k is microbatch
k % M on its pass k // M. A state buffer holds one item per stage. Each of
the r M + g - 1 iterations t of a `lax.scan`
  1. puts item t into stage 0's slot (microbatch t % M: the input on the
     first pass, later what the last stage left in its slot of the
     microbatch buffer),
  2. runs every stage on its slot at once (`jax.vmap` over the stage axis
     with `spmd_axis_name="stage"`, so each stage's devices compute only
     their stage); stage s works on item t - s with its chunk for pass
     (t - s) // M,
  3. stores the last stage's result in the microbatch buffer, and
  4. rotates the state buffer by one stage (`jnp.roll`: a collective
     permute between neighbouring stages; the last stage's result reaches
     stage 0 only through the microbatch buffer).
Item k leaves the last stage at iteration k + g - 1 and comes back to stage
0 as item k + M at iteration k + M, so r > 1 needs M >= g. Slots outside
0 <= t - s < r M (the bubble, (g - 1) / (r M + g - 1) of the work) hold
values that never reach the outputs, so they add nothing to the gradients.
Differentiating the scan gives the backward pass in reverse order.

`stage_chunks` lays a stack of layers' state out as those [g, r, ...]
stage parameters; `maxtext.models.layer_stack.pipeline_blocks` runs a
model's blocks through `circular`.

The data moving through the stages is any pytree (the residual stream plus,
e.g., each row's positions and segment ids), every leaf with the microbatch
rows first.

`PipelineConfig` is the `pipeline` config section: not architecture (the
parameters and outputs are those of the model without it), so it is not in
`ModelConfig`; `maxtext.models.execution` checks it against the model.

Shape suffixes: `maxtext.common.axes.SHAPE_KEY`.
"""

from collections.abc import Callable
import dataclasses
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp

from maxtext.common import axes
from maxtext.common import sections

# Logical name of the stage axis of activations (and the mesh axis the
# stages are vmapped over).
STAGE = "stage"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineConfig:
  """The `pipeline` config section (training only; decoding runs without).

  Attributes:
    stages: The layers are split over this many stages; equals the size of
      the `stage` mesh axis (configs/common ties them). 1 is off. Needs
      `model.scan_layers`.
    microbatches: Slices of the batch that flow through the stages; 0 means
      one per stage. Divides the batch; at least `stages` when `repeats` >
      1.
    repeats: Passes of each microbatch through the stages: the layers are
      split into stages * repeats chunks of consecutive layers, stage s
      holding chunks s, s + stages, ... (circular schedule; the bubble
      shrinks to (stages - 1) / (repeats * microbatches + stages - 1)). 1 is
      GPipe: each stage holds one chunk. Divides num_layers / stages.
  """

  stages: int = 1
  microbatches: int = 0
  repeats: int = 1

  def __post_init__(self):
    if isinstance(self.stages, bool) or not isinstance(
        self.stages, int) or self.stages < 1:
      raise ValueError(
          f"pipeline.stages={self.stages!r} must be a positive integer (the"
          " size of the 'stage' mesh axis; that axis cannot be -1 with"
          " pipelining).")
    sections.check_int("pipeline.microbatches", self.microbatches, minimum=0)
    sections.check_int("pipeline.repeats", self.repeats, minimum=1)
    if self.repeats > 1 and 0 < self.microbatches < self.stages:
      raise ValueError(
          f"pipeline.microbatches={self.microbatches}: the circular schedule"
          f" (pipeline.repeats={self.repeats}) needs at least"
          f" pipeline.stages={self.stages} microbatches, or 0 for one per"
          " stage.")


def split_microbatches(tree: Any, count: int) -> Any:
  """Every leaf [B, ...] as [M, b, ...]: row i goes to microbatch i % M.

  Interleaving keeps each microbatch spread over the batch shards.

  Raises:
    ValueError: `count` does not divide the batch.
  """

  def split(x_B):
    rows = x_B.shape[0]
    if rows % count:
      raise ValueError(f"The batch of {rows} rows does not split into"
                       f" {count} pipeline microbatches; set"
                       " pipeline.microbatches to a divisor of it.")
    return jnp.reshape(x_B, (rows // count, count, *x_B.shape[1:])
                       ).swapaxes(0, 1)

  return jax.tree.map(split, tree)


def merge_microbatches(tree: Any) -> Any:
  """Inverse of `split_microbatches`: every leaf [M, b, ...] as [B, ...]."""
  return jax.tree.map(
      lambda x_M: x_M.swapaxes(0, 1).reshape(-1, *x_M.shape[2:]), tree)


def circular(stage_fn: Callable[[Any, Any], Any], stage_params: Any,
             inputs_M: Any, *, names: Any) -> Any:
  """Runs microbatches through chunk g r - 1(...chunk 1(chunk 0(x))).

  Chunk c is stage c % g's chunk for pass c // g.

  Args:
    stage_fn: `stage_fn(params, x) -> y`, one chunk on one microbatch; `y`
      has the structure, shapes and dtypes of `x`.
    stage_params: Parameters of every chunk, each leaf [g, r, ...]: [s, i]
      is chunk i g + s. Any per-chunk data (e.g. each layer's attention
      window) can ride along.
    inputs_M: Microbatches, each leaf [M, b, ...].
    names: Logical axis names of one microbatch's leaves (a pytree of
      tuples matching `inputs_M` without its leading axis); the buffer is
      constrained to (STAGE, *names).

  Returns:
    The last chunk's outputs, each leaf [M, b, ...].

  Raises:
    ValueError: r > 1 with fewer microbatches than stages.
  """
  num_stages, num_repeats = jax.tree.leaves(stage_params)[0].shape[:2]
  num_microbatches = jax.tree.leaves(inputs_M)[0].shape[0]
  if num_repeats > 1 and num_microbatches < num_stages:
    raise ValueError(
        f"The circular schedule needs at least as many microbatches as"
        f" stages: {num_microbatches} microbatches < {num_stages} stages"
        f" (with {num_repeats} repeats); set pipeline.microbatches to"
        f" {num_stages} or more, or 0 for one per stage.")

  def constrain(tree_g):
    # `tree_g` is a prefix of `names`: each array meets its tuple of names.
    return jax.tree.map(lambda x_g, n: axes.constrain(x_g, (STAGE, *n)),
                        tree_g, names)

  def run_stage(params_r, repeat, x):
    return stage_fn(jax.tree.map(
        lambda p_r: jax.lax.dynamic_index_in_dim(p_r, repeat, keepdims=False),
        params_r), x)

  def step(carry, t):
    state_g, buffer_M = carry
    new = jax.tree.map(
        lambda x_M: jax.lax.dynamic_index_in_dim(
            x_M, t % num_microbatches, keepdims=False), buffer_M)
    state_g = constrain(jax.tree.map(lambda s, x: s.at[0].set(x),
                                     state_g, new))
    # Stage s works on item t - s; bubble items take any valid pass.
    repeat_g = jnp.clip((t - jnp.arange(num_stages)) // num_microbatches,
                        0, num_repeats - 1)
    out_g = constrain(jax.vmap(run_stage, spmd_axis_name=STAGE)(
        stage_params, repeat_g, state_g))
    # The last stage finished item t - (g - 1); before that it only held
    # bubble values, written to slot 0 and overwritten by item 0 before
    # stage 0 reads that slot again.
    done = jnp.maximum(t - (num_stages - 1), 0) % num_microbatches
    buffer_M = jax.tree.map(
        lambda o_M, y_g: jax.lax.dynamic_update_index_in_dim(
            o_M, y_g[-1], done, 0), buffer_M, out_g)
    return (jax.tree.map(lambda y_g: jnp.roll(y_g, 1, axis=0), out_g),
            buffer_M), None

  state_g = jax.tree.map(
      lambda x_M: jnp.zeros((num_stages, *x_M.shape[1:]), x_M.dtype),
      inputs_M)
  (_, outputs_M), _ = jax.lax.scan(
      step, (state_g, inputs_M),
      jnp.arange(num_repeats * num_microbatches + num_stages - 1))
  return outputs_M


def stage_chunks(stacked: nnx.State, stages: int, repeats: int) -> nnx.State:
  """The stage parameters of `circular`: a stack of layers' state (every
  leaf [l, ...], sharded by its partition spec) as [g, r, l / (g r), ...],
  layer (i g + s) C + j at [s, i, j], stage s's chunk (of C layers) for
  pass i.

  Both ends keep the parameter layout (g over `stage`) under
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
    a_rgl = layout(a, names).reshape(repeats, stages, -1, *a.shape[1:])
    return layout(a_rgl.swapaxes(0, 1), (axes.LAYERS, None, None, *names[1:]))

  # Under `nnx.capture` the blocks also hold the capture's (empty)
  # intermediates, which have no partition spec: they stay as they are.
  captures, stacked = nnx.split_state(stacked, nnx.Intermediate, ...)
  return nnx.merge_state(captures, jax.tree.map(
      to_stages, stacked, nnx.get_partition_spec(stacked),
      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)))
