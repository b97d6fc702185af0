"""What every post-training run shares: mesh, Tunix trainer settings,
metrics, the optimizer, and the run's start and end (the binaries' `main`
is `maxtext.posttrain.binary`).

Tunix reads the mesh from the legacy `with mesh:` context, our code from
`jax.set_mesh`; `Runtime.activate()` enters both. Tunix's metrics
(`jax.monitoring` events "<prefix>/<mode>/<name>") are written through our
writers (`maxtext.metrics.writers`: the log, <workdir>/metrics.jsonl and
TensorBoard) as `train/<name>` and `eval/<name>`, one line per update;
runs that give a `hooks.Throughput` (sft) add `perf/*` (step time, tokens/s,
MFU) as pre-training does.
"""

from collections.abc import Iterable, Iterator, Sequence
import contextlib
import dataclasses
import os
import time
from typing import Any

import jax
import ml_collections
import optax
import orbax.checkpoint as ocp
from tunix.sft import metrics_logger as tunix_metrics
from tunix.sft import peft_trainer

from maxtext.common import workdir as workdir_lib
from maxtext.metrics import writers as writers_lib
from maxtext.optim import optimizer as optimizer_lib
from maxtext.posttrain import base_model
from maxtext.posttrain.config import PosttrainConfig
from maxtext.sharding import mesh as mesh_lib
from maxtext.sharding import rules as rules_lib
from maxtext.trainers import hooks
from maxtext.trainers import preemption

TUNIX_CHECKPOINT_DIRNAME = "tunix_checkpoints"
# Prefixes of the metric names Tunix logs (metrics_prefix "").
_MODES = ("train/", "eval/")


class MetricsBackend:
  """A Tunix logging backend writing to our metric writers.

  Tunix registers it as a `jax.monitoring` scalar listener, which also hears
  other libraries' scalars (Orbax I/O); only Tunix's "/train/..." and
  "/eval/..." events are written. Closing it unregisters it.
  """

  def __init__(self, writer: writers_lib.MetricWriter,
               throughput: hooks.Throughput | None = None):
    """`throughput`: also write `perf/*` (step time, tokens/s, MFU) with
    each update's metrics, timed between updates (none for the first)."""
    self.writer = writer
    self.throughput = throughput
    self._step = None
    self._metrics: dict[str, float | None] = {}
    self._timed = None  # (step, time) of the last update's metrics.

  def log_scalar(self, event: str, value: Any, *, step: int | None = None,
                 **kwargs) -> None:
    del kwargs
    name = event.lstrip("/")
    if not name.startswith(_MODES) or step is None:
      return
    if step != self._step:
      self._flush()
      self._step = step
    self._metrics[name] = float(value)

  def _flush(self) -> None:
    if self._metrics:
      if self.throughput is not None and "train/loss" in self._metrics:
        now = time.perf_counter()
        if self._timed is not None and self._step > self._timed[0]:
          self._metrics.update(self.throughput.metrics(
              (now - self._timed[1]) / (self._step - self._timed[0])))
        self._timed = (self._step, now)
      self.writer.write(int(self._step), self._metrics)
    self._metrics = {}

  def close(self) -> None:
    self._flush()
    self.writer.close()
    try:
      jax.monitoring.unregister_scalar_listener(self.log_scalar)
    except (AssertionError, ValueError):
      pass  # Already cleared (Tunix clears all listeners after closing us).


@dataclasses.dataclass(frozen=True)
class RunResult:
  """What a post-training run returns.

  Attributes:
    exported: {"export"|"hf"|"peft_adapter": folder} written at the end
      (nothing when preempted).
    trainer: The Tunix trainer after training (its metrics logger holds the
      metric history).
    model: The trained model.
    preempted: The run stopped early on SIGTERM or Ctrl-C, after saving
      its checkpoint (`train_until_stopped`); rerunning resumes it.
  """

  exported: dict[str, str]
  trainer: Any
  model: base_model.LoadedModel
  preempted: bool = False


def _until_stopped(batches: Iterable[Any], hook: preemption.PreemptionHook,
                   every: int) -> Iterator[Any]:
  """`batches`, ending at the first boundary of `every` batches (one
  update) after the hook saw SIGTERM or Ctrl-C."""
  for index, batch in enumerate(batches):
    if index % every == 0 and hook.should_stop(index // every):
      return
    yield batch


def train_until_stopped(trainer: Any, batches: Iterable[Any],
                        eval_batches: Iterable[Any] | None, *,
                        every: int = 1) -> bool:
  """`trainer.train(batches, eval_batches)` (a Tunix trainer or learner)
  that stops cleanly on SIGTERM or Ctrl-C (`preemption.PreemptionHook`).

  The batches end at the next update boundary (`every` batches make one
  update: the microbatches of gradient accumulation), so Tunix's loop ends
  as if the data ran out: it saves its last checkpoint and closes. Tunix
  resumes by skipping the batches already trained, so a rerun continues
  from the same data position.

  Returns:
    Whether a signal stopped the run, or came after the last boundary (the
    training finished, and its export is left to a rerun).
  """
  hook = preemption.PreemptionHook()
  hook.on_begin(0, None)
  try:
    trainer.train(_until_stopped(batches, hook, every), eval_batches)
  finally:
    hook.close()
  return hook.preempted_at is not None or hook.signalled


@dataclasses.dataclass(frozen=True)
class Runtime:
  """The devices of a run.

  Attributes:
    mesh: The device mesh.
    rules: Parameter and compute layouts on it.
  """

  mesh: jax.sharding.Mesh
  rules: rules_lib.LogicalRules

  @contextlib.contextmanager
  def activate(self) -> Iterator[None]:
    with self.mesh, jax.set_mesh(self.mesh):
      yield

  def data_axes(self, rows: int, length: int) -> tuple[Any, ...]:
    """Tunix's `data_sharding_axis` for [rows, length] inputs."""
    return tuple(self.rules.batch_sharding((rows, length)).spec)


def make_runtime(config: PosttrainConfig,
                 devices: Sequence[jax.Device] | None = None) -> Runtime:
  """The mesh and rules of `config` over `devices` (default: all; e.g. a
  compile-only TPU slice's, or the trainer's share of them).

  Raises:
    ValueError: the mesh does not fit the devices, or a microbatch does not
      split over the batch shards.
  """
  mesh = mesh_lib.make_mesh(config.mesh, devices)
  rules = rules_lib.LogicalRules.from_config(mesh, config.sharding)
  if config.train.rows % rules.batch_shards():
    raise ValueError(
        f"train.batch_size / train.microbatches = {config.train.rows} rows"
        f" must divide over the {rules.batch_shards()} batch shards of the"
        " mesh.")
  return Runtime(mesh=mesh, rules=rules)


def make_optimizer(config: PosttrainConfig) -> optax.GradientTransformation:
  """AdamW with the schedule of `config.optimizer` over `train.steps`."""
  return optimizer_lib.make_optimizer(config.optimizer, config.train.steps)


def training_config(config: PosttrainConfig, workdir: str,
                    runtime: Runtime, length: int,
                    cls: type[Any] = peft_trainer.TrainingConfig,
                    throughput: hooks.Throughput | None = None,
                    metrics_backend: type[MetricsBackend] = MetricsBackend,
                    **fields) -> Any:
  """Tunix's training config (`cls`, a `peft_trainer.TrainingConfig`) of a
  run: steps, accumulation, evaluation, checkpoints and metrics, written by
  `metrics_backend` (a `MetricsBackend` class: RL renames Tunix's events;
  with `throughput`, `perf/*` too)."""
  train = config.train
  writer = writers_lib.make_writers(
      workdir, tensorboard=config.logging.tensorboard,
      is_main_process=jax.process_index() == 0)
  metrics = tunix_metrics.MetricsLoggerOptions(
      log_dir=workdir,
      backend_kwargs={"custom_backend": [
          lambda: metrics_backend(writer, throughput)]})
  every = train.checkpoint_every_steps or train.steps
  return cls(
      eval_every_n_steps=config.data.eval_every_steps or train.steps + 1,
      max_steps=train.steps,
      gradient_accumulation_steps=(
          train.microbatches if train.microbatches > 1 else None),
      checkpoint_root_directory=os.path.join(workdir,
                                             TUNIX_CHECKPOINT_DIRNAME),
      checkpointing_options=ocp.CheckpointManagerOptions(
          save_interval_steps=every, max_to_keep=train.max_checkpoints),
      metrics_logging_options=metrics,
      data_sharding_axis=runtime.data_axes(train.rows, length),
      pbar_description=None,
      **fields)


def start(config: ml_collections.ConfigDict, workdir: str,
          config_class: type[Any] = PosttrainConfig) -> tuple[Any, str]:
  """Validates `config` as a `config_class` (a `PosttrainConfig`, or RL's;
  its exports may not overwrite `train.load`) and writes it to the
  (absolute) workdir."""
  posttrain = config_class.from_config_dict(config)
  workdir = os.path.abspath(workdir)
  if posttrain.train.load:
    base_model.check_export_folders(workdir, posttrain.train.load)
  if jax.process_index() == 0:
    workdir_lib.write_config(workdir, config.to_dict(), step=0)
  return posttrain, workdir


def finish(config: PosttrainConfig, workdir: str,
           loaded: base_model.LoadedModel, trainer: Any, *,
           preempted: bool = False) -> RunResult:
  """Exports the trained model as `config.export` asks (outside the mesh
  context: building abstract models reads logical axis names); a preempted
  run exports nothing."""
  if preempted:
    return RunResult(exported={}, trainer=trainer, model=loaded,
                     preempted=True)
  exported = base_model.export(
      workdir, loaded, config.lora, merged=config.export.merged,
      hf=config.export.hf, peft_adapter=config.export.peft_adapter,
      tokenizer=config.data.tokenizer)
  return RunResult(exported=exported, trainer=trainer, model=loaded)
