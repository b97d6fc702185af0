"""The training loop: dispatch steps, fetch metrics one step late, run hooks.

The loop never waits for the device on the step it has just dispatched: after
dispatching update `s + 1` it fetches the metrics of update `s` (already done
or about to be), so the device always has the next step queued. A hook that
needs the state of update `s` to be known good (a checkpoint) makes the loop
fetch that update's metrics first (`Hook.needs_metrics_before`).

A non-finite loss or gradient norm stops the run with `NonFiniteError`
naming the update, unless the train step skipped that update
(`SKIPPED_METRIC`). So does a state that is not finite after an update
(`STATE_FINITE_METRIC`, whatever made it so, skipped or not): it is found
with the update's metrics, before any hook saves it, so no checkpoint holds
a non-finite state. Steps are counted from 1: "step s" is the s-th update, and
the state after it has `state.step == s`.

A hook may ask to stop early (`Hook.should_stop`); the loop then ends as if
the run were complete (hooks' `on_end` run, e.g. a final checkpoint).
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
import math
from typing import Any

import jax


class NonFiniteError(FloatingPointError):
  """The loss, the gradient norm or the new state became NaN or infinite."""


# Metrics checked for NaN/Inf after every update.
CHECKED_METRICS = ("train/loss", "grads/global_norm")
# 1 when the train step skipped the update (`maxtext.optim.update_guard`):
# its non-finite values did not reach the parameters, so the run goes on.
SKIPPED_METRIC = "train/skipped"
# 0 when the state after the update holds a NaN or infinity (a control flag
# of the train step, not passed on to the hooks).
STATE_FINITE_METRIC = "train/state_finite"


class Hook:
  """Extends the loop. Override what you need; every method is optional.

  Attributes:
    every: The hook's period in updates (0: never periodic); see `due`.
  """

  every: int = 0

  def due(self, step: int) -> bool:
    """Whether `step` is one of this hook's periodic steps."""
    return self.every > 0 and step % self.every == 0

  def on_begin(self, step: int, state: Any) -> None:
    """Called once before the first update; `step` updates are already done."""

  def after_step(self, step: int, state: Any) -> None:
    """Called right after update `step` is dispatched (not yet finished)."""

  def needs_metrics_before(self, step: int) -> bool:
    """Whether `after_step(step)` needs the metrics of `step` checked first."""
    del step
    return False

  def on_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
    """Host metrics of update `step` (called one update late)."""

  def should_stop(self, step: int) -> bool:
    """Whether to end the run after update `step`."""
    del step
    return False

  def on_end(self, step: int, state: Any) -> None:
    """Called once after the last update of a successful run."""

  def close(self) -> None:
    """Called once at the end of every run, also when it fails."""


def _publish(step: int, device_metrics: Mapping[str, jax.Array],
             hooks: Sequence[Hook]) -> None:
  metrics = {k: float(v) for k, v in jax.device_get(device_metrics).items()}
  if not metrics.pop(STATE_FINITE_METRIC, 1.0):
    raise NonFiniteError(
        f"The parameters or optimizer state became NaN or infinite at step"
        f" {step} (train/loss {metrics.get('train/loss')}, grads/global_norm"
        f" {metrics.get('grads/global_norm')}); stopping before they are"
        " saved: a rerun resumes from the last checkpoint. Lower"
        " optimizer.learning_rate or check the data of this step.")
  if not metrics.get(SKIPPED_METRIC):
    for key in CHECKED_METRICS:
      value = metrics.get(key)
      if value is not None and not math.isfinite(value):
        raise NonFiniteError(
            f"{key} is {value} at step {step}; stopping the run. Lower"
            " optimizer.learning_rate, check the data of this step, or set"
            " train.skip_nonfinite=True to skip such updates.")
  for hook in hooks:
    hook.on_metrics(step, metrics)


def run_loop(
    state: Any,
    step_fn: Callable[[Any, Any], tuple[Any, Mapping[str, jax.Array]]],
    batches: Iterator[Any],
    *,
    start_step: int,
    total_steps: int,
    hooks: Sequence[Hook] = (),
) -> tuple[Any, int]:
  """Runs updates `start_step + 1` .. `total_steps`.

  Args:
    state: The state after `start_step` updates.
    step_fn: `(state, batch) -> (state, metrics)`; may donate `state`.
    batches: Yields the batch of each update, starting with update
      `start_step + 1` (0-based batch index `start_step`).
    start_step: Updates already done.
    total_steps: Updates of the whole run.
    hooks: Called in order at each event.

  Returns:
    (final state, number of updates done).

  Raises:
    NonFiniteError: the loss, gradient norm or new state is not finite
      (names the step).
  """
  step = start_step
  pending = None  # (step, device metrics) not yet published.
  try:
    for hook in hooks:
      hook.on_begin(step, state)
    while step < total_steps:
      state, metrics = step_fn(state, next(batches))
      step += 1
      if pending is not None:
        _publish(*pending, hooks)
      pending = (step, metrics)
      if step == total_steps or any(
          hook.needs_metrics_before(step) for hook in hooks):
        _publish(*pending, hooks)
        pending = None
      for hook in hooks:
        hook.after_step(step, state)
      if any(hook.should_stop(step) for hook in hooks):
        break
    if pending is not None:
      _publish(*pending, hooks)
    for hook in hooks:
      hook.on_end(step, state)
  finally:
    for hook in hooks:
      hook.close()
  return state, step
