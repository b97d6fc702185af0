"""Goodput: where the wall time of a training job went, across restarts.

A `GoodputRecorder` divides the wall time of one run (one process of the
train binary) into spans:
  init        from the recorder's creation to the first update, less the
              recorded spans before it (mesh, state, restoring, data setup);
  compile     compiling the train step (`add("compile", seconds)`);
  data_wait   waiting for the next batch (`timed_batches`);
  checkpoint  saving checkpoints (`TimedHook(hook, recorder, "checkpoint")`);
  eval        evaluating (`TimedHook(hook, recorder, "eval")`);
  step        the rest of the loop: updates, metrics, other hooks.
It appends its cumulative spans to `<workdir>/goodput.jsonl` when the loop
begins, after each timed save or evaluation, every `every` updates with
`GoodputHook`, at the end, and when the run fails (counting the update in
progress), so a run that dies leaves what it did up to its last record; a
run that fails before its first update leaves none.

Restart loss: when a later run of the same workdir starts at update s (the
checkpoint it restored), everything the run before it did after its last
record at an update <= s (or, without one, after its loop began) was redone,
and counts as `restart_loss` instead of its spans. Goodput is the step time
that counts divided by the wall time of all runs (from each recorder's
creation to its last record; the time between runs is not known and not
counted).

`GoodputHook` implements the training loop's hook interface
(`maxtext.trainers.loop.Hook`) without importing it (metrics sits below
trainers): at the end it logs the goodput and writes `goodput/*` metrics.
"""

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
import dataclasses
import json
import os
import time
from typing import Any

from absl import logging

from maxtext.metrics import writers as writers_lib

FILENAME = "goodput.jsonl"
# Spans measured directly; "init" and "step" are what remains before and in
# the loop.
RECORDED_SPANS = ("compile", "data_wait", "checkpoint", "eval")
SPANS = ("init", "compile", "data_wait", "step", "checkpoint", "eval")


class GoodputRecorder:
  """Measures the spans of one run and appends its records to the workdir.

  Attributes:
    path: `<workdir>/goodput.jsonl`.
    write: Whether this process appends records there.
    run: This run's number (1 + the previous runs recorded there).
  """

  def __init__(self, workdir: str, *, write: bool = True,
               clock: Callable[[], float] = time.monotonic):
    """Starts the clock of a run.

    Args:
      workdir: The run's workdir.
      write: Append records to the workdir (the main process only).
      clock: Seconds, monotonic.
    """
    self.path = os.path.join(workdir, FILENAME)
    self.write = write
    self._clock = clock
    self._start = clock()
    self._recorded = dict.fromkeys(RECORDED_SPANS, 0.0)
    self._loop = None  # (start time, recorded seconds then, init seconds).
    self._file = None
    self.run = 1
    if write and os.path.exists(self.path):
      writers_lib.drop_torn_last_line(self.path)  # A killed run's.
      self.run += max((r["run"] for r in read_records(self.path)), default=0)

  def add(self, span: str, seconds: float) -> None:
    """Adds `seconds` measured elsewhere (e.g. compilation) to `span`."""
    if span not in RECORDED_SPANS:
      raise ValueError(f"Unknown span {span!r}; valid: {RECORDED_SPANS}.")
    self._recorded[span] += seconds

  def timed(self, span: str, fn: Callable[..., Any], *args, **kwargs) -> Any:
    """`fn(*args, **kwargs)`, its duration added to `span`."""
    start = self._clock()
    try:
      return fn(*args, **kwargs)
    finally:
      self.add(span, self._clock() - start)

  def timed_batches(self, batches: Iterable[Any]) -> Iterator[Any]:
    """`batches`, the time spent waiting for each counted as data_wait."""
    iterator = iter(batches)
    while True:
      try:
        batch = self.timed("data_wait", next, iterator)
      except StopIteration:
        return
      yield batch

  def spans(self) -> dict[str, float]:
    """Seconds of each span so far (they add up to the elapsed time)."""
    now = self._clock() - self._start
    recorded_now = sum(self._recorded.values())
    if self._loop is None:
      init, step = now - recorded_now, 0.0
    else:
      loop_start, recorded_then, init = self._loop
      step = (now - loop_start) - (recorded_now - recorded_then)
    return {"init": init, **self._recorded, "step": step}

  def begin_loop(self, step: int) -> None:
    """Marks the first update (`step` updates done before) and records."""
    now = self._clock() - self._start
    recorded = sum(self._recorded.values())
    self._loop = (now, recorded, now - recorded)
    self.record(step)

  def record(self, step: int) -> None:
    """Appends this run's spans after `step` updates to the workdir."""
    if not self.write:
      return
    if self._file is None:  # Opened at the first record: a run that fails
      # before its loop writes nothing.
      os.makedirs(os.path.dirname(self.path), exist_ok=True)
      self._file = open(self.path, "a", encoding="utf-8")
    spans = self.spans()
    line = {"run": self.run, "step": step,
            "elapsed_s": sum(spans.values()),
            **{f"{name}_s": spans[name] for name in SPANS}}
    self._file.write(json.dumps(line) + "\n")
    self._file.flush()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None


def read_records(path: str) -> list[dict[str, Any]]:
  """The records of `goodput.jsonl`, in order.

  Raises:
    ValueError: a line is not a JSON object (names the file and line).
  """
  records = []
  with open(path, encoding="utf-8", errors="replace") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        record = e
      if not isinstance(record, dict):
        raise ValueError(f"{path}:{number} is not a goodput record ({record});"
                         " move the file away to start its account afresh.")
      records.append(record)
  return records


@dataclasses.dataclass(frozen=True)
class Summary:
  """Where a job's wall time went.

  Attributes:
    seconds: Seconds per span (`SPANS`) and "restart_loss".
    total_s: Wall time of all runs.
    percent: Goodput: 100 * seconds["step"] / total_s.
    runs: Runs of the workdir.
  """

  seconds: dict[str, float]
  total_s: float
  percent: float
  runs: int

  def metrics(self) -> dict[str, float]:
    """`goodput/*` metrics."""
    return {"goodput/percent": self.percent,
            "goodput/total_s": self.total_s,
            **{f"goodput/{name}_s": value
               for name, value in self.seconds.items()}}

  def describe(self) -> str:
    parts = ", ".join(f"{name} {value:.1f} s"
                      for name, value in self.seconds.items())
    return (f"Goodput {self.percent:.1f}% of {self.total_s:.1f} s over"
            f" {self.runs} run(s): {parts}.")


def summarize(records: Sequence[Mapping[str, Any]]) -> Summary:
  """The `Summary` of the records of all runs of a workdir.

  Raises:
    ValueError: there are no records.
  """
  runs: dict[int, list[Mapping[str, Any]]] = {}
  for record in records:
    runs.setdefault(record["run"], []).append(record)
  if not runs:
    raise ValueError("No goodput records to summarize.")
  seconds = dict.fromkeys((*SPANS, "restart_loss"), 0.0)
  total = 0.0
  order = sorted(runs)
  for run, next_run in zip(order, [*order[1:], None]):
    last = runs[run][-1]
    kept = last
    if next_run is not None:
      resumed_at = runs[next_run][0]["step"]
      # Without a record at or before it, only the setup before the loop
      # (the first record) was not redone.
      kept = next((r for r in reversed(runs[run]) if r["step"] <= resumed_at),
                  runs[run][0])
    for name in SPANS:
      seconds[name] += kept[f"{name}_s"]
    seconds["restart_loss"] += last["elapsed_s"] - kept["elapsed_s"]
    total += last["elapsed_s"]
  percent = 100.0 * seconds["step"] / total if total > 0 else 0.0
  return Summary(seconds=seconds, total_s=total, percent=percent,
                 runs=len(runs))


class TimedHook:
  """A loop hook whose work at its due steps (`after_step`) and at the end
  (`on_end`) counts as `span`, with a record after each; everything else is
  the wrapped hook's."""

  def __init__(self, hook: Any, recorder: GoodputRecorder, span: str):
    if span not in RECORDED_SPANS:
      raise ValueError(f"Unknown span {span!r}; valid: {RECORDED_SPANS}.")
    self._hook = hook
    self._recorder = recorder
    self._span = span

  def __getattr__(self, name: str) -> Any:
    return getattr(self._hook, name)

  def after_step(self, step: int, state: Any) -> None:
    if not self._hook.due(step):
      self._hook.after_step(step, state)
      return
    self._recorder.timed(self._span, self._hook.after_step, step, state)
    self._recorder.record(step)

  def on_end(self, step: int, state: Any) -> None:
    self._recorder.timed(self._span, self._hook.on_end, step, state)


class GoodputHook:
  """Records progress for goodput and reports it at the end of the run.

  Put it after every other hook, so that their end-of-run work (the final
  checkpoint) is counted. Implements `maxtext.trainers.loop.Hook`.

  Attributes:
    every: Also record every this many updates (0: only at the events).
    summary: The job's `Summary` once the run ended successfully.
  """

  def __init__(self, recorder: GoodputRecorder, *,
               writer: writers_lib.MetricWriter | None = None,
               every: int = 0):
    self.recorder = recorder
    self.writer = writer
    self.every = every
    self.summary = None
    self._step = None

  def due(self, step: int) -> bool:
    return self.every > 0 and step % self.every == 0

  def on_begin(self, step: int, state: Any) -> None:
    self._step = step
    self.recorder.begin_loop(step)

  def after_step(self, step: int, state: Any) -> None:
    self._step = step
    if self.due(step):
      self.recorder.record(step)

  def needs_metrics_before(self, step: int) -> bool:
    del step
    return False

  def on_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
    pass

  def should_stop(self, step: int) -> bool:
    del step
    return False

  def on_end(self, step: int, state: Any) -> None:
    self.recorder.record(step)
    self._step = None
    if not self.recorder.write:
      return
    self.summary = summarize(read_records(self.recorder.path))
    logging.info("%s", self.summary.describe())
    if self.writer is not None:
      self.writer.write(step, self.summary.metrics())
      self.writer.flush()

  def close(self) -> None:
    if self._step is not None:
      # The run failed during the update after `_step` (or its hooks): keep
      # what it did, that update included.
      self.recorder.record(self._step + 1)
    self.recorder.close()
