"""The standard hooks of the training loop: metrics, checkpoints, profiler."""

from collections.abc import Callable, Mapping
import dataclasses
import math
import os
import time
from typing import Any

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np

from maxtext.checkpoint import manager as checkpoint_lib
from maxtext.metrics import writers as writers_lib
from maxtext.trainers import loop


@dataclasses.dataclass(frozen=True, kw_only=True)
class Throughput:
  """What converts step time into throughput figures.

  Attributes:
    tokens_per_step: Tokens in one global batch.
    num_devices: Devices sharing the work.
    flops_per_token: Training FLOPs per token.
    peak_flops_per_device: Peak FLOP/s of one device; 0 if unknown.
  """

  tokens_per_step: int
  num_devices: int
  flops_per_token: float
  peak_flops_per_device: float

  def metrics(self, step_time_s: float) -> dict[str, float | None]:
    """`perf/*` figures for one update taking `step_time_s` seconds."""
    tokens_per_s = self.tokens_per_step / step_time_s / self.num_devices
    flops_per_s = tokens_per_s * self.flops_per_token
    mfu = (flops_per_s / self.peak_flops_per_device
           if self.peak_flops_per_device > 0 else None)
    return {
        "perf/step_time_s": step_time_s,
        "perf/tokens_per_s_per_device": tokens_per_s,
        "perf/tflops_per_s_per_device": flops_per_s / 1e12,
        "perf/mfu": mfu,
    }


class MetricsHook(loop.Hook):
  """Writes train, gradient and performance metrics every `every` updates.

  Also writes the first update of the run and the last one. Performance
  figures average over the updates since the previous write.
  """

  def __init__(self, writer: writers_lib.MetricWriter, *, every: int,
               total_steps: int, throughput: Throughput):
    self.every = every
    self.writer = writer
    self.total_steps = total_steps
    self.throughput = throughput
    self._first_step = None
    self._last = None  # (step, time) of the previous write.
    self.last_metrics: dict[str, float | None] = {}

  def on_begin(self, step: int, state: Any) -> None:
    self._first_step = step + 1
    self._last = (step, time.perf_counter())

  def on_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
    if not (self.due(step) or step in (self._first_step, self.total_steps)):
      return
    now = time.perf_counter()
    last_step, last_time = self._last
    self._last = (step, now)
    step_time = (now - last_time) / max(step - last_step, 1)
    loss = metrics["train/loss"]
    out = {"train/loss": loss,
           "train/perplexity": math.exp(min(loss, 700.0))}
    out.update(metrics)
    out.update(self.throughput.metrics(step_time))
    out["perf/eta_s"] = step_time * (self.total_steps - step)
    self.writer.write(step, out)
    # Whole lines reach the file at once: a killed run leaves no partial line
    # for the resumed run to append to.
    self.writer.flush()
    self.last_metrics = out

  def on_end(self, step: int, state: Any) -> None:
    self.writer.flush()

  def close(self) -> None:
    self.writer.close()


class CheckpointHook(loop.Hook):
  """Saves a checkpoint every `every` updates and at the end of the run.

  The data state saved with it is `data_state()` (the input pipeline's
  position after the batches consumed so far, a JSON-able dict) plus
  "next_step", the number of updates done.

  With `every_seconds > 0` it also saves after an update when that long has
  passed since its previous save (or the start); with several processes,
  process 0's clock decides for all (a one-scalar broadcast per update).
  With `save_at_end=False` (a local tier) the end of the run saves nothing.
  """

  def __init__(self, checkpointer: checkpoint_lib.Checkpointer, *, every: int,
               data_state: Callable[[], Mapping[str, Any]],
               every_seconds: float = 0.0, save_at_end: bool = True,
               clock: Callable[[], float] = time.monotonic):
    self.every = every
    self.checkpointer = checkpointer
    self.data_state = data_state
    self.every_seconds = every_seconds
    self.save_at_end = save_at_end
    self._clock = clock
    self._last_save_time = clock()
    self._timed = (None, False)  # (step, whether the time is up at it).

  def due(self, step: int) -> bool:
    if super().due(step):
      return True
    if self.every_seconds <= 0:
      return False
    if self._timed[0] != step:  # Decide once per step, the same everywhere.
      time_up = self._clock() - self._last_save_time >= self.every_seconds
      if jax.process_count() > 1:
        time_up = bool(multihost_utils.broadcast_one_to_all(
            np.asarray(time_up)))
      self._timed = (step, time_up)
    return self._timed[1]

  def on_begin(self, step: int, state: Any) -> None:
    self._last_save_time = self._clock()

  def _save(self, step: int, state: Any) -> None:
    self.checkpointer.save(step, state.checkpoint_tree(),
                           {**self.data_state(), "next_step": step})
    self._last_save_time = self._clock()

  def needs_metrics_before(self, step: int) -> bool:
    return self.due(step)  # Never save a state whose loss is not finite.

  def after_step(self, step: int, state: Any) -> None:
    if self.due(step):
      self._save(step, state)

  def on_end(self, step: int, state: Any) -> None:
    if not self.save_at_end:
      return
    self._save(step, state)
    self.checkpointer.wait()
    logging.info("Checkpoint of step %d in %s.", step,
                 self.checkpointer.step_path(step))

  def close(self) -> None:
    self.checkpointer.close()


class ProfilerHook(loop.Hook):
  """Traces updates [start_step, start_step + num_steps) (0-based) with
  `jax.profiler` into `logdir` (open with TensorBoard's profile plugin or
  Perfetto)."""

  def __init__(self, logdir: str, *, start_step: int, num_steps: int):
    self.logdir = logdir
    self.start_step = start_step
    self.stop_step = start_step + num_steps
    self._active = False

  def on_begin(self, step: int, state: Any) -> None:
    if step == self.start_step:
      self._start()

  def after_step(self, step: int, state: Any) -> None:
    if step == self.start_step and not self._active:
      self._start()
    elif step == self.stop_step and self._active:
      jax.block_until_ready(state)
      self._stop()

  def _start(self) -> None:
    os.makedirs(self.logdir, exist_ok=True)
    jax.profiler.start_trace(self.logdir)
    self._active = True
    logging.info("Profiler started; trace goes to %s.", self.logdir)

  def _stop(self) -> None:
    jax.profiler.stop_trace()
    self._active = False
    logging.info("Profiler stopped; trace in %s.", self.logdir)

  def close(self) -> None:
    if self._active:
      self._stop()


class SkipLimit(loop.Hook):
  """Stops the run with `loop.NonFiniteError` when more than `limit` updates
  in a row were skipped (`loop.SKIPPED_METRIC`), naming them."""

  def __init__(self, limit: int):
    self.limit = limit
    self._first = None  # First step of the current run of skips.

  def on_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
    if not metrics.get(loop.SKIPPED_METRIC):
      self._first = None
      return
    if self._first is None:
      self._first = step
    if step - self._first + 1 > self.limit:
      raise loop.NonFiniteError(
          f"Updates {self._first}..{step} were all skipped, more than"
          f" train.max_consecutive_skips={self.limit} in a row; stopping the"
          " run. Lower optimizer.learning_rate, check the data of these"
          " steps, or raise train.spike_zscore.")


class StopAtStep(loop.Hook):
  """Ends the run after update `step` (as if preempted, with a checkpoint)."""

  def __init__(self, step: int):
    self.step = step

  def should_stop(self, step: int) -> bool:
    return step >= self.step


class EvalHook(loop.Hook):
  """Evaluates the state every `every` updates and writes `eval/*` metrics.

  `evaluate(state)` returns the metrics (e.g. `eval_step.evaluate` over a
  fresh pass of the evaluation split); it runs on every process, right after
  update `step` is dispatched, and waits for its result before the next update
  may donate the state. The metrics go to `writer` at `step`, as their own
  line of `metrics.jsonl` before that step's training line.
  """

  def __init__(self, evaluate: Callable[[Any], Mapping[str, float]],
               writer: writers_lib.MetricWriter, *, every: int):
    self.every = every
    self.evaluate = evaluate
    self.writer = writer
    self.last_metrics: dict[str, float] = {}

  def after_step(self, step: int, state: Any) -> None:
    if self.due(step):
      self.last_metrics = dict(self.evaluate(state))
      self.writer.write(step, self.last_metrics)
