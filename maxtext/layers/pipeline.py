"""Pipeline parallelism: a GPipe schedule over the `stage` axis, plain JAX.

The layers are split into S consecutive stages whose parameters are stacked
on a leading stage axis (sharded over the `stage` mesh axis), and the batch
into M microbatches. A state buffer holds one microbatch per stage. Each of
the M + S - 1 iterations of a `lax.scan`
  1. puts the next microbatch into stage 0's slot,
  2. runs every stage on its slot at once (`jax.vmap` over the stage axis
     with `spmd_axis_name="stage"`, so each stage's devices compute only
     their stage),
  3. stores the last stage's result as a finished microbatch, and
  4. rotates the buffer by one stage (`jnp.roll`: a collective permute
     between neighbouring stages).
Stage s works on microbatch t - s at iteration t; the other slots (the
bubble, (S - 1) / (M + S - 1) of the work) hold values that never reach the
outputs, so they add nothing to the gradients. Differentiating the scan gives
the backward pass in reverse order.

The data moving through the stages is any pytree (the residual stream plus,
e.g., each row's positions and segment ids), every leaf with the microbatch
rows first.

Shape key: S stages, M microbatches, B batch rows, b rows of a microbatch.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from maxtext.common import axes

# Logical name of the stage axis of activations (and the mesh axis the
# stages are vmapped over).
STAGE = "stage"


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
                       " model.pipeline_microbatches to a divisor of it.")
    return jnp.reshape(x_B, (rows // count, count, *x_B.shape[1:])
                       ).swapaxes(0, 1)

  return jax.tree.map(split, tree)


def merge_microbatches(tree: Any) -> Any:
  """Inverse of `split_microbatches`: every leaf [M, b, ...] as [B, ...]."""
  return jax.tree.map(
      lambda x_M: x_M.swapaxes(0, 1).reshape(-1, *x_M.shape[2:]), tree)


def gpipe(stage_fn: Callable[[Any, Any], Any], stage_params: Any,
          inputs_M: Any, *, names: Any) -> Any:
  """Runs microbatches through the stages in order: stage S-1(...stage 0(x)).

  Args:
    stage_fn: `stage_fn(params, x) -> y`, one stage on one microbatch; `y`
      has the structure, shapes and dtypes of `x`.
    stage_params: Parameters of every stage, each leaf [S, ...].
    inputs_M: Microbatches, each leaf [M, b, ...].
    names: Logical axis names of one microbatch's leaves (a pytree of
      tuples matching `inputs_M` without its leading axis); the buffer is
      constrained to (STAGE, *names).

  Returns:
    The last stage's outputs, each leaf [M, b, ...].
  """
  num_stages = jax.tree.leaves(stage_params)[0].shape[0]
  num_microbatches = jax.tree.leaves(inputs_M)[0].shape[0]

  def constrain(tree_S):
    # `tree_S` is a prefix of `names`: each array meets its tuple of names.
    return jax.tree.map(lambda x_S, n: axes.constrain(x_S, (STAGE, *n)),
                        tree_S, names)

  def step(carry, t):
    state_S, outputs_M = carry
    new = jax.tree.map(
        lambda x_M: jax.lax.dynamic_index_in_dim(
            x_M, jnp.minimum(t, num_microbatches - 1), keepdims=False),
        inputs_M)
    state_S = constrain(jax.tree.map(lambda s, x: s.at[0].set(x),
                                     state_S, new))
    out_S = constrain(jax.vmap(stage_fn, spmd_axis_name=STAGE)(
        stage_params, state_S))
    # The last stage finished microbatch t - (S - 1); before that it only
    # held bubble values, written to slot 0 and overwritten later.
    done = jnp.maximum(t - (num_stages - 1), 0)
    outputs_M = jax.tree.map(
        lambda o_M, y_S: jax.lax.dynamic_update_index_in_dim(
            o_M, y_S[-1], done, 0), outputs_M, out_S)
    return (jax.tree.map(lambda y_S: jnp.roll(y_S, 1, axis=0), out_S),
            outputs_M), None

  state_S = jax.tree.map(
      lambda x_M: jnp.zeros((num_stages, *x_M.shape[1:]), x_M.dtype),
      inputs_M)
  (_, outputs_M), _ = jax.lax.scan(
      step, (state_S, jax.tree.map(jnp.zeros_like, inputs_M)),
      jnp.arange(num_microbatches + num_stages - 1))
  return outputs_M
