"""Tests for maxtext.trainers.loop with a scripted step function."""

import itertools
import math

from absl.testing import absltest
import jax.numpy as jnp

from maxtext.trainers import loop


class Recorder(loop.Hook):
  """Records every event in order."""

  def __init__(self, every=0, metrics_before=(), stop_at=None):
    self.every = every
    self.events = []
    self.metrics_before = set(metrics_before)
    self.stop_at = stop_at

  def on_begin(self, step, state):
    self.events.append(("begin", step))

  def after_step(self, step, state):
    self.events.append(("after_step", step))

  def needs_metrics_before(self, step):
    return step in self.metrics_before

  def on_metrics(self, step, metrics):
    self.events.append(("metrics", step, metrics["train/loss"]))

  def should_stop(self, step):
    return self.stop_at is not None and step >= self.stop_at

  def on_end(self, step, state):
    self.events.append(("end", step))

  def close(self):
    self.events.append(("close",))


def _step_fn(losses):
  """A step whose loss at update s (1-based) is losses[s - 1]."""

  def step_fn(state, batch):
    del batch
    step = state + 1
    return step, {"train/loss": jnp.asarray(losses[step - 1]),
                  "grads/global_norm": jnp.asarray(1.0)}

  return step_fn


class LoopTest(absltest.TestCase):

  def test_metrics_arrive_one_step_late(self):
    hook = Recorder()
    state, step = loop.run_loop(0, _step_fn([5.0, 4.0, 3.0]),
                                itertools.repeat(None), start_step=0,
                                total_steps=3, hooks=[hook])
    self.assertEqual((state, step), (3, 3))
    self.assertEqual(hook.events, [
        ("begin", 0),
        ("after_step", 1),
        ("metrics", 1, 5.0),  # Fetched after update 2 was dispatched.
        ("after_step", 2),
        ("metrics", 2, 4.0),
        ("metrics", 3, 3.0),  # The last update is fetched at once.
        ("after_step", 3),
        ("end", 3),
        ("close",),
    ])

  def test_hook_can_ask_for_checked_metrics_first(self):
    hook = Recorder(metrics_before=[2])
    loop.run_loop(0, _step_fn([5.0, 4.0, 3.0, 2.0]), itertools.repeat(None),
                  start_step=0, total_steps=4, hooks=[hook])
    index = hook.events.index(("after_step", 2))
    self.assertEqual(hook.events[index - 1], ("metrics", 2, 4.0))

  def test_nan_stops_the_run_naming_the_step(self):
    hook = Recorder(metrics_before=[3])
    with self.assertRaisesRegex(loop.NonFiniteError,
                                "train/loss is nan at step 3"):
      loop.run_loop(0, _step_fn([5.0, 4.0, float("nan"), 2.0, 1.0]),
                    itertools.repeat(None), start_step=0, total_steps=5,
                    hooks=[hook])
    # A hook needing checked metrics never sees the bad step's state.
    self.assertNotIn(("after_step", 3), hook.events)
    self.assertNotIn(("end", 3), hook.events)
    self.assertEqual(hook.events[-1], ("close",))

  def test_infinite_gradient_norm_stops_the_run(self):
    def step_fn(state, batch):
      del batch
      return state + 1, {"train/loss": jnp.asarray(1.0),
                         "grads/global_norm": jnp.asarray(jnp.inf)}

    with self.assertRaisesRegex(loop.NonFiniteError,
                                "grads/global_norm is inf at step 1"):
      loop.run_loop(0, step_fn, itertools.repeat(None), start_step=0,
                    total_steps=3)

  def test_skipped_non_finite_update_does_not_stop_the_run(self):
    def step_fn(state, batch):
      del batch
      bad = state + 1 == 2  # Update 2 had a NaN loss and was skipped.
      return state + 1, {
          "train/loss": jnp.asarray(float("nan") if bad else 1.0),
          "grads/global_norm": jnp.asarray(float("inf") if bad else 1.0),
          loop.SKIPPED_METRIC: jnp.asarray(1.0 if bad else 0.0)}

    hook = Recorder()
    _, step = loop.run_loop(0, step_fn, itertools.repeat(None), start_step=0,
                            total_steps=3, hooks=[hook])
    self.assertEqual(step, 3)
    metrics = [event for event in hook.events if event[0] == "metrics"]
    self.assertEqual([m[1] for m in metrics], [1, 2, 3])
    self.assertTrue(math.isnan(metrics[1][2]))

  def test_resume_and_early_stop(self):
    hook = Recorder(stop_at=4)
    state, step = loop.run_loop(2, _step_fn([9.0] * 10),
                                itertools.repeat(None), start_step=2,
                                total_steps=10, hooks=[hook])
    self.assertEqual((state, step), (4, 4))
    self.assertEqual(hook.events[0], ("begin", 2))
    self.assertEqual(hook.events[-3:],
                     [("metrics", 4, 9.0), ("end", 4), ("close",)])


if __name__ == "__main__":
  absltest.main()
