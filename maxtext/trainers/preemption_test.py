"""Tests for maxtext.trainers.preemption with the real loop and signal."""

import itertools
import os
import signal
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp

from maxtext.trainers import loop
from maxtext.trainers import preemption


class Recorder(loop.Hook):

  def __init__(self):
    self.steps_done = []
    self.ended_at = None

  def after_step(self, step, state):
    self.steps_done.append(step)

  def on_end(self, step, state):
    self.ended_at = step


def _step_fn(sigterm_at, signum=signal.SIGTERM, times=1):
  """A step that sends this process `signum` (`times` times) while running
  update `sigterm_at`."""

  def step_fn(state, batch):
    del batch
    if state + 1 == sigterm_at:
      for _ in range(times):
        os.kill(os.getpid(), signum)
    return state + 1, {"train/loss": jnp.asarray(1.0)}

  return step_fn


class PreemptionHookTest(parameterized.TestCase):

  @parameterized.named_parameters(("sigterm", signal.SIGTERM),
                                  ("ctrl_c", signal.SIGINT))
  def test_a_signal_stops_at_the_next_step_boundary_and_ends_the_run(
      self, signum):
    before = signal.getsignal(signum)
    hook, recorder = preemption.PreemptionHook(), Recorder()
    state, step = loop.run_loop(0, _step_fn(sigterm_at=3, signum=signum),
                                itertools.repeat(None), start_step=0,
                                total_steps=10, hooks=[recorder, hook])
    self.assertEqual((state, step), (3, 3))
    self.assertEqual(hook.preempted_at, 3)
    # The update in flight finished and on_end (the final checkpoint) ran.
    self.assertEqual(recorder.steps_done, [1, 2, 3])
    self.assertEqual(recorder.ended_at, 3)
    self.assertIs(signal.getsignal(signum), before)

  def test_a_second_ctrl_c_interrupts_at_once(self):
    before = signal.getsignal(signal.SIGINT)
    hook, recorder = preemption.PreemptionHook(), Recorder()
    with self.assertRaises(KeyboardInterrupt):
      loop.run_loop(0, _step_fn(sigterm_at=3, signum=signal.SIGINT, times=2),
                    itertools.repeat(None), start_step=0, total_steps=10,
                    hooks=[recorder, hook])
    self.assertEqual(recorder.steps_done, [1, 2])  # Update 3 never ended.
    self.assertIs(signal.getsignal(signal.SIGINT), before)

  def test_without_sigterm_the_run_completes(self):
    hook = preemption.PreemptionHook()
    _, step = loop.run_loop(0, _step_fn(sigterm_at=None),
                            itertools.repeat(None), start_step=0,
                            total_steps=4, hooks=[hook])
    self.assertEqual(step, 4)
    self.assertIsNone(hook.preempted_at)

  def test_several_processes_stop_where_jax_agrees(self):
    # With several processes JAX's preemption notifier owns SIGTERM and
    # names the common stop step; the hook installs no handler.
    before = signal.getsignal(signal.SIGTERM)
    asked = []

    def sync_point(step):
      asked.append(step)
      return step == 5

    hook = preemption.PreemptionHook()
    with mock.patch.object(jax, "process_count", return_value=2), \
        mock.patch.object(preemption.multihost_utils,
                          "reached_preemption_sync_point", sync_point):
      hook.on_begin(0, None)
      self.assertIs(signal.getsignal(signal.SIGTERM), before)
      stops = [hook.should_stop(step) for step in range(1, 7)]
    self.assertEqual(stops, [False] * 4 + [True, True])
    self.assertEqual(asked, [1, 2, 3, 4, 5])
    self.assertEqual(hook.preempted_at, 5)


if __name__ == "__main__":
  absltest.main()
