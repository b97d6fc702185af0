"""Metric writers: a log line, `metrics.jsonl` and TensorBoard event files.

Metrics are flat mappings from namespaced keys (`train/loss`, `perf/mfu`) to
floats. A value of None means "not available" (e.g. MFU on a device of unknown
peak): the log line shows `n/a`, the JSONL file `null`, TensorBoard skips it.
"""

import abc
from collections.abc import Mapping, Sequence
import json
import math
import os

from absl import logging
import tensorboardX

Metrics = Mapping[str, float | None]

JSONL_FILENAME = "metrics.jsonl"
TENSORBOARD_DIRNAME = "tensorboard"


class MetricWriter(abc.ABC):
  """Receives the metrics of a step."""

  @abc.abstractmethod
  def write(self, step: int, metrics: Metrics) -> None:
    """Records `metrics` at `step`."""

  def flush(self) -> None:
    """Makes what was written durable."""

  def close(self) -> None:
    """Flushes and releases resources."""
    self.flush()


def _format(value: float | None) -> str:
  if value is None:
    return "n/a"
  if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
    return f"{value:.3e}"
  return f"{value:.4f}" if not float(value).is_integer() else f"{value:.0f}"


class LogWriter(MetricWriter):
  """One absl log line per write: `step 10 | train/loss=5.1 | ...`.

  Keys appear in the order of the mapping.
  """

  def write(self, step: int, metrics: Metrics) -> None:
    parts = [f"{key}={_format(value)}" for key, value in metrics.items()]
    logging.info("step %d | %s", step, " | ".join(parts))


def drop_torn_last_line(path: str, block_bytes: int = 1 << 16) -> None:
  """Truncates JSONL file `path` after its last newline (a killed writer's
  partial line), reading only its tail."""
  if not os.path.isfile(path):
    return
  with open(path, "rb+") as f:
    end = f.seek(0, os.SEEK_END)
    position = end
    while position > 0:
      start = max(0, position - block_bytes)
      f.seek(start)
      block = f.read(position - start)
      if position == end and block.endswith(b"\n"):
        return
      newline = block.rfind(b"\n")
      if newline >= 0:
        f.truncate(start + newline + 1)
        return
      position = start
    f.truncate(0)  # One line, torn.


class JsonlWriter(MetricWriter):
  """Appends `{"step": s, key: value, ...}` lines to `<workdir>/metrics.jsonl`.

  A resumed run appends too; when a step appears twice, the later line wins.
  A last line left half-written by a killed run is cut off first.
  """

  def __init__(self, workdir: str):
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, JSONL_FILENAME)
    drop_torn_last_line(self.path)
    self._file = open(self.path, "a", encoding="utf-8")

  def write(self, step: int, metrics: Metrics) -> None:
    record = {"step": step}
    for key, value in metrics.items():
      record[key] = None if value is None or not math.isfinite(value) else (
          float(value))
    self._file.write(json.dumps(record) + "\n")

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()


class TensorBoardWriter(MetricWriter):
  """Scalars in TensorBoard event files under `<workdir>/tensorboard`."""

  def __init__(self, workdir: str):
    self.logdir = os.path.join(workdir, TENSORBOARD_DIRNAME)
    self._writer = tensorboardX.SummaryWriter(logdir=self.logdir)

  def write(self, step: int, metrics: Metrics) -> None:
    for key, value in metrics.items():
      if value is not None:
        self._writer.add_scalar(key, float(value), global_step=step)

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


class MultiWriter(MetricWriter):
  """Writes to each of several writers."""

  def __init__(self, writers: Sequence[MetricWriter]):
    self.writers = list(writers)

  def write(self, step: int, metrics: Metrics) -> None:
    for writer in self.writers:
      writer.write(step, metrics)

  def flush(self) -> None:
    for writer in self.writers:
      writer.flush()

  def close(self) -> None:
    for writer in self.writers:
      writer.close()


def make_writers(workdir: str, *, tensorboard: bool,
                 is_main_process: bool = True) -> MetricWriter:
  """The log line everywhere; the files only on the main process."""
  writers: list[MetricWriter] = [LogWriter()]
  if is_main_process:
    writers.append(JsonlWriter(workdir))
    if tensorboard:
      writers.append(TensorBoardWriter(workdir))
  return MultiWriter(writers)


def read_jsonl(path: str) -> dict[int, dict[str, float | None]]:
  """Metrics of `metrics.jsonl` by step: the keys of every line of a step
  (e.g. its eval line and its train line) merged, later lines winning (a
  step written again after a restart)."""
  by_step = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      if line.strip():
        record = json.loads(line)
        by_step.setdefault(record.pop("step"), {}).update(record)
  return by_step
