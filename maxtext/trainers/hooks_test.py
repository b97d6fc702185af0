"""Tests for maxtext.trainers.hooks."""

import glob
import itertools
import math
import os

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.checkpoint import manager as checkpoint_lib
from maxtext.metrics import writers
from maxtext.trainers import hooks
from maxtext.trainers import loop


class ListWriter(writers.MetricWriter):

  def __init__(self):
    self.rows = []

  def write(self, step, metrics):
    self.rows.append((step, dict(metrics)))


class FakeState:
  """A state whose checkpoint tree is one array holding the step."""

  def __init__(self, step):
    self.step = step

  def checkpoint_tree(self):
    return {"value": jnp.full((2,), float(self.step))}


def _step_fn(state, batch):
  del batch
  return FakeState(state.step + 1), {
      "train/loss": jnp.asarray(1.0 / (state.step + 1)),
      "grads/global_norm": jnp.asarray(0.5)}


class ThroughputTest(absltest.TestCase):

  def test_figures(self):
    throughput = hooks.Throughput(tokens_per_step=1000, num_devices=2,
                                  flops_per_token=1e9,
                                  peak_flops_per_device=4e12)
    metrics = throughput.metrics(step_time_s=0.5)
    self.assertEqual(metrics["perf/tokens_per_s_per_device"], 1000.0)
    self.assertEqual(metrics["perf/tflops_per_s_per_device"], 1.0)
    self.assertEqual(metrics["perf/mfu"], 0.25)
    unknown = hooks.Throughput(tokens_per_step=1000, num_devices=2,
                               flops_per_token=1e9, peak_flops_per_device=0)
    self.assertIsNone(unknown.metrics(0.5)["perf/mfu"])


class MetricsHookTest(absltest.TestCase):

  def test_writes_first_periodic_and_last_steps(self):
    writer = ListWriter()
    hook = hooks.MetricsHook(
        writer, every=3, total_steps=7,
        throughput=hooks.Throughput(tokens_per_step=8, num_devices=1,
                                    flops_per_token=1.0,
                                    peak_flops_per_device=0.0))
    loop.run_loop(FakeState(0), _step_fn, itertools.repeat(None),
                  start_step=0, total_steps=7, hooks=[hook])
    self.assertEqual([step for step, _ in writer.rows], [1, 3, 6, 7])
    step, last = writer.rows[-1]
    self.assertEqual(last["train/loss"], np.float32(1 / 7))
    self.assertAlmostEqual(last["train/perplexity"], math.exp(1 / 7),
                           places=6)
    self.assertEqual(last["perf/eta_s"], 0.0)
    self.assertGreater(writer.rows[1][1]["perf/eta_s"], 0.0)
    self.assertIsNone(last["perf/mfu"])
    self.assertEqual(step, 7)
    self.assertEqual(hook.last_metrics, last)


class CheckpointHookTest(absltest.TestCase):

  def test_saves_periodically_and_at_the_end_with_the_data_position(self):
    directory = self.create_tempdir().full_path
    checkpointer = checkpoint_lib.Checkpointer(directory, max_to_keep=5,
                                               async_save=True)
    hook = hooks.CheckpointHook(checkpointer, every=2,
                                data_state=lambda: {"shuffle_seed": 3})
    loop.run_loop(FakeState(0), _step_fn, itertools.repeat(None),
                  start_step=0, total_steps=5, hooks=[hook])
    checkpointer = checkpoint_lib.Checkpointer(directory, max_to_keep=5,
                                               async_save=True)
    self.assertEqual(checkpointer.all_steps(), [2, 4, 5])
    tree, data = checkpointer.restore(
        {"value": jax.ShapeDtypeStruct((2,), jnp.float32)}, step=4)
    np.testing.assert_array_equal(tree["value"], [4.0, 4.0])
    self.assertEqual(data, {"shuffle_seed": 3, "next_step": 4})
    checkpointer.close()

  def test_saves_when_the_time_is_up_and_a_local_tier_not_at_the_end(self):
    now = [0.0]

    def step_fn(state, batch):
      now[0] += 25.0  # Each update takes 25 s of the fake clock.
      return _step_fn(state, batch)

    persistent = checkpoint_lib.Checkpointer(
        os.path.join(self.create_tempdir().full_path, "persistent"),
        max_to_keep=10, async_save=True)
    local = checkpoint_lib.Checkpointer(
        os.path.join(self.create_tempdir().full_path, "local"),
        max_to_keep=10, async_save=True, tier="local")
    loop.run_loop(FakeState(0), step_fn, itertools.repeat(None),
                  start_step=0, total_steps=7, hooks=[
                      hooks.CheckpointHook(persistent, every=0,
                                           every_seconds=60.0,
                                           data_state=dict,
                                           clock=lambda: now[0]),
                      hooks.CheckpointHook(local, every=2, data_state=dict,
                                           save_at_end=False)])
    # 60 s pass after updates 3 (75 s) and 6 (150 s); 7 is the end.
    self.assertEqual(persistent.all_steps(), [3, 6, 7])
    self.assertEqual(local.all_steps(), [2, 4, 6])


class SkipLimitTest(absltest.TestCase):

  def test_more_skips_in_a_row_than_the_limit_stop_naming_them(self):
    hook = hooks.SkipLimit(3)
    skipped = {loop.SKIPPED_METRIC: 1.0}
    # Runs of 3 skips (the limit) go on; an applied update starts over.
    for step in range(1, 12):
      hook.on_metrics(step, {loop.SKIPPED_METRIC: float(step not in (4, 8))})
    with self.assertRaisesRegex(
        loop.NonFiniteError, r"^Updates 9..12 were all skipped, more than"
        r" train.max_consecutive_skips=3 in a row"):
      hook.on_metrics(12, skipped)
    # Without a guard there is no skip metric: nothing is counted.
    hooks.SkipLimit(0).on_metrics(1, {"train/loss": 1.0})


class ProfilerHookTest(absltest.TestCase):

  def test_traces_the_window(self):
    logdir = self.create_tempdir().full_path
    hook = hooks.ProfilerHook(logdir, start_step=1, num_steps=2)
    events = []

    def step_fn(state, batch):
      del batch
      events.append(hook._active)  # pylint: disable=protected-access
      return jnp.sin(state) + 1, {"train/loss": jnp.asarray(1.0)}

    loop.run_loop(jnp.zeros(()), step_fn, itertools.repeat(None),
                  start_step=0, total_steps=4, hooks=[hook])
    # Updates 0..3 (0-based); 1 and 2 run inside the trace.
    self.assertEqual(events, [False, True, True, False])
    self.assertNotEmpty(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"),
                                  recursive=True))


if __name__ == "__main__":
  absltest.main()
