"""Skipping bad updates: a non-finite or spiking loss or gradient norm.

`skip_bad_updates(inner, ...)` wraps an optax transformation. Its `update`
takes the step's loss as the extra argument `value` (optax's name for it) and
decides inside the jitted step, without a host sync, whether to apply the
update. An update is bad when
  * (`skip_nonfinite`) the loss or the global gradient norm is NaN or
    infinite, or
  * (`spike_zscore = z > 0`) once `spike_window = W` updates were accepted,
    the loss or the gradient norm exceeds `mean + z * std` (population std)
    of the last W accepted ones.
A bad update is skipped: zero updates, the inner optimizer state unchanged
(as `optax.apply_if_finite` does, so the inner step count, and with it the
learning-rate schedule, does not advance), and its values stay out of the
window. The gradient norm is that of the gradients the wrapper receives
(before any clipping inside `inner`).

The guard's state is part of the optimizer state, so it is checkpointed: a
resumed run decides exactly as an uninterrupted one. `step_metrics` reads
"train/skipped" (1 when this update was skipped) and "train/skipped_steps"
(skipped so far) from it.

The guard can be switched on or off, and its window resized, when a run
resumes: `restore_target` says what to restore a checkpoint's optimizer
state into and how to turn that into the state the resumed run wants. The
inner optimizer state always carries over; a guard switched on (or a window
resized) starts a fresh window, so spikes are looked for again once W new
updates are accepted, and the skipped count carries over when there was one.
"""

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class GuardState(NamedTuple):
  """State of `skip_bad_updates`.

  Attributes:
    inner_state: The wrapped optimizer's state.
    recent: float32 [W, 2] (W = `spike_window`, not a shape-key letter),
      loss and gradient norm of the last W accepted updates (a ring buffer;
      slot `num_accepted % W` is written next).
    num_accepted: Updates applied so far (int32).
    num_skipped: Updates skipped so far (int32).
    skipped: Whether the last update was skipped (bool).
  """

  inner_state: optax.OptState
  recent: jax.Array
  num_accepted: jax.Array
  num_skipped: jax.Array
  skipped: jax.Array


def skip_bad_updates(inner: optax.GradientTransformation, *,
                     skip_nonfinite: bool, spike_zscore: float,
                     spike_window: int
                     ) -> optax.GradientTransformationExtraArgs:
  """`inner`, skipping the updates the module docstring calls bad.

  Args:
    inner: The optimizer.
    skip_nonfinite: Skip updates whose loss or gradient norm is not finite.
    spike_zscore: Skip updates whose loss or gradient norm is more than this
      many standard deviations above the window's mean; 0 is off.
    spike_window: Accepted updates the mean and deviation are taken over
      (and needed before spikes are looked for).

  Returns:
    The wrapped transformation; `update` requires `value=` (the loss).
  """
  if spike_zscore < 0:
    raise ValueError(f"spike_zscore={spike_zscore!r} must be >= 0 (0 is off).")
  if spike_window < 1:
    raise ValueError(f"spike_window={spike_window!r} must be >= 1.")
  inner = optax.with_extra_args_support(inner)

  def init(params: Any) -> GuardState:
    return GuardState(
        inner_state=inner.init(params),
        recent=jnp.zeros((spike_window, 2), jnp.float32),
        num_accepted=jnp.zeros((), jnp.int32),
        num_skipped=jnp.zeros((), jnp.int32),
        skipped=jnp.zeros((), jnp.bool_))

  def update(updates: Any, state: GuardState, params: Any = None, *,
             value: jax.Array, **extra_args) -> tuple[Any, GuardState]:
    observed = jnp.stack([jnp.asarray(value, jnp.float32),
                          optax.tree.norm(updates).astype(jnp.float32)])
    bad = jnp.zeros((), jnp.bool_)
    if skip_nonfinite:
      bad |= ~jnp.all(jnp.isfinite(observed))
    if spike_zscore > 0:
      limit = (state.recent.mean(axis=0) +
               spike_zscore * state.recent.std(axis=0))
      bad |= ((state.num_accepted >= spike_window) &
              jnp.any(observed > limit))
    new_updates, new_inner = inner.update(updates, state.inner_state, params,
                                          value=value, **extra_args)
    updates = jax.tree.map(lambda u: jnp.where(bad, jnp.zeros_like(u), u),
                           new_updates)
    inner_state = jax.tree.map(lambda new, old: jnp.where(bad, old, new),
                               new_inner, state.inner_state)
    slot = state.num_accepted % spike_window
    recent = jnp.where(bad, state.recent, state.recent.at[slot].set(observed))
    return updates, GuardState(
        inner_state=inner_state, recent=recent,
        num_accepted=state.num_accepted + jnp.where(bad, 0, 1),
        num_skipped=state.num_skipped + jnp.where(bad, 1, 0),
        skipped=bad)

  return optax.GradientTransformationExtraArgs(init, update)


def step_metrics(opt_state: Any) -> dict[str, jax.Array]:
  """"train/skipped" and "train/skipped_steps" when `opt_state` is guarded.

  Returns an empty dict for an optimizer state without the guard.
  """
  if not isinstance(opt_state, GuardState):
    return {}
  return {"train/skipped": opt_state.skipped.astype(jnp.float32),
          "train/skipped_steps": opt_state.num_skipped}


def _fresh(like: jax.ShapeDtypeStruct, value=0) -> jax.Array:
  """A `like`-shaped array of `value`, placed as `like` (every process)."""
  return jax.jit(lambda: jnp.full(like.shape, value, like.dtype),
                 out_shardings=like.sharding)()


def _replicated(tree: Any):
  """A sharding that replicates over the devices `tree`'s leaves are on."""
  sharding = jax.tree.leaves(tree)[0].sharding
  if isinstance(sharding, jax.sharding.NamedSharding):
    return jax.sharding.NamedSharding(sharding.mesh,
                                      jax.sharding.PartitionSpec())
  return sharding


def _is_saved_guard(saved: Any) -> bool:
  """Whether checkpoint metadata `saved` is a `GuardState` (saved as a dict
  of its fields)."""
  return isinstance(saved, Mapping) and set(saved) == set(GuardState._fields)


def restore_target(saved: Any, wanted: Any
                   ) -> tuple[Any, Callable[[Any], Any]]:
  """(what to restore, how to convert it) for a checkpoint's optimizer state.

  Args:
    saved: The checkpoint's metadata of the optimizer state (Orbax's tree:
      a `GuardState` reads as a dict of its fields).
    wanted: The resumed run's abstract optimizer state (shapes, dtypes and
      shardings), a `GuardState` when its guard is on.

  Returns:
    The abstract tree to restore the saved optimizer state into, and the
    function that makes the wanted state of the restored one (the identity
    when nothing changed).
  """
  saved_guard = _is_saved_guard(saved)
  if isinstance(wanted, GuardState) and not saved_guard:  # Switched on.
    return wanted.inner_state, lambda inner: GuardState(
        inner_state=inner, recent=_fresh(wanted.recent),
        num_accepted=_fresh(wanted.num_accepted),
        num_skipped=_fresh(wanted.num_skipped), skipped=_fresh(wanted.skipped))
  if isinstance(wanted, GuardState):
    if tuple(saved["recent"].shape) == wanted.recent.shape:
      return wanted, lambda state: state
    # Resized: the saved counts, a fresh window.
    target = wanted._replace(recent=jax.ShapeDtypeStruct(
        tuple(saved["recent"].shape), wanted.recent.dtype,
        sharding=wanted.recent.sharding))
    return target, lambda state: state._replace(
        recent=_fresh(wanted.recent), num_accepted=_fresh(wanted.num_accepted))
  if not saved_guard:
    return wanted, lambda state: state
  # Switched off: the saved guard is restored, its inner state kept.
  replicated = _replicated(wanted)
  fields = {name: jax.ShapeDtypeStruct(tuple(saved[name].shape),
                                       saved[name].dtype, sharding=replicated)
            for name in GuardState._fields if name != "inner_state"}
  return (GuardState(inner_state=wanted, **fields),
          lambda state: state.inner_state)
