"""Pre-training: config + workdir -> a trained, checkpointed model.

`train(config, workdir)` validates the config, restores the latest checkpoint
of `workdir/checkpoints` if there is one (parameters, optimizer state, and the
data position, so the run continues exactly where it stopped), otherwise
initialises, then runs the loop with the standard hooks (metrics,
checkpoints, profiler) plus any given ones.

`prepare(experiment, checkpointer)` is the same setup without the loop, for
benchmarks (`tools/bench/train_bench.py`).
"""

from collections.abc import Iterator, Sequence
import dataclasses
import logging as py_logging
import os
import time
from typing import Any

from absl import logging
import jax
import ml_collections

from maxtext.checkpoint import manager as checkpoint_lib
from maxtext.data import pipeline
from maxtext.metrics import flops
from maxtext.metrics import writers
from maxtext.optim import optimizer
from maxtext.sharding import mesh as mesh_lib
from maxtext.sharding import rules as rules_lib
from maxtext.trainers import hooks as hooks_lib
from maxtext.trainers import loop
from maxtext.trainers import train_state as train_state_lib
from maxtext.trainers import train_step as train_step_lib
from maxtext.trainers import workdir as workdir_lib
from maxtext.trainers.config import ExperimentConfig


@dataclasses.dataclass
class Prepared:
  """A run ready to loop.

  Attributes:
    state: The state after `start_step` updates.
    start_step: Updates already done (0, or the restored checkpoint's step).
    batches: Device batches of updates `start_step + 1`, `start_step + 2`, ...
    step_fn: The compiled train step.
    compile_time_s: Seconds spent lowering and compiling it.
    throughput: Converts step times into throughput and MFU.
    mesh: The device mesh.
  """

  state: train_state_lib.TrainState
  start_step: int
  batches: Iterator[dict[str, jax.Array]]
  step_fn: Any
  compile_time_s: float
  throughput: hooks_lib.Throughput
  mesh: jax.sharding.Mesh


@dataclasses.dataclass(frozen=True)
class TrainResult:
  """What `train` returns.

  Attributes:
    state: The final state.
    step: Updates done in total.
    metrics: The last written metrics (empty if nothing was trained).
  """

  state: train_state_lib.TrainState
  step: int
  metrics: dict[str, float | None]


def _device_batches(mesh, sharding,
                    local_batches) -> Iterator[dict[str, jax.Array]]:
  for local_batch in local_batches:
    yield mesh_lib.batch_to_device(mesh, local_batch, sharding)


def prepare(experiment: ExperimentConfig,
            checkpointer: checkpoint_lib.Checkpointer | None = None
            ) -> Prepared:
  """Builds the mesh, state (restored if `checkpointer` has one), data and
  compiled step of `experiment`."""
  mesh = mesh_lib.make_mesh(experiment.mesh)
  rules = rules_lib.LogicalRules.from_config(mesh, experiment.sharding)
  batch_shards = rules.batch_shards()
  batch_size = experiment.train.batch_size
  microbatches = experiment.train.microbatches
  if batch_size % (batch_shards * microbatches):
    raise ValueError(
        f"train.batch_size={batch_size} must be divisible by the"
        f" {batch_shards} batch shards of the mesh times"
        f" train.microbatches={microbatches}.")
  total_steps = experiment.train.steps
  tx = optimizer.make_optimizer(experiment.optimizer, total_steps)
  state_args = dict(
      seed=experiment.train.seed, tx=tx,
      schedule=optimizer.learning_rate_schedule(experiment.optimizer,
                                                total_steps),
      z_loss=experiment.optimizer.z_loss, mesh=mesh, rules=rules,
      microbatches=microbatches)
  model_config = experiment.model

  start_step = 0
  latest = checkpointer.latest_step() if checkpointer else None
  if latest is not None:
    abstract = train_state_lib.create_train_state(
        model_config, abstract=True, **state_args)
    tree, data_state = checkpointer.restore(abstract.checkpoint_tree(),
                                            step=latest)
    state = abstract.replace_checkpoint_tree(tree)
    start_step = int(data_state["next_step"])
    if data_state.get("shuffle_seed") != experiment.data.shuffle_seed:
      logging.warning("Checkpoint was written with data.shuffle_seed=%s; the"
                      " config now says %s.", data_state.get("shuffle_seed"),
                      experiment.data.shuffle_seed)
    logging.info("Restored %s: resuming after update %d.",
                 checkpointer.step_path(latest), start_step)
  else:
    state = train_state_lib.create_train_state(model_config, **state_args)

  source = pipeline.make_source(experiment.data,
                                vocab_size=model_config.vocab_size)
  local_batches = pipeline.make_batches(
      source, batch_size=batch_size, seed=experiment.data.shuffle_seed,
      process_index=jax.process_index(), process_count=jax.process_count())
  seq_len = experiment.data.seq_len
  batch_sharding = rules.batch_sharding((batch_size, seq_len))
  batches = _device_batches(mesh, batch_sharding,
                            pipeline.iterate(local_batches, start_step))
  batch_spec = jax.ShapeDtypeStruct((batch_size, seq_len), jax.numpy.int32,
                                    sharding=batch_sharding)
  start = time.perf_counter()
  step_fn = train_step_lib.train_step.lower(
      state, {"inputs": batch_spec, "targets": batch_spec,
              "mask": batch_spec}).compile()
  compile_time_s = time.perf_counter() - start

  throughput = hooks_lib.Throughput(
      tokens_per_step=batch_size * seq_len, num_devices=mesh.size,
      flops_per_token=flops.training_flops_per_token(model_config, seq_len),
      peak_flops_per_device=flops.peak_flops_per_device(
          override=experiment.logging.peak_flops_per_device))
  return Prepared(state=state, start_step=start_step, batches=batches,
                  step_fn=step_fn, compile_time_s=compile_time_s,
                  throughput=throughput, mesh=mesh)


class _DropInfoFrom(py_logging.Filter):
  """Drops INFO records logged from files under a path fragment."""

  def __init__(self, fragment: str):
    super().__init__()
    self.fragment = fragment

  def filter(self, record: py_logging.LogRecord) -> bool:
    return (record.levelno > py_logging.INFO or
            self.fragment not in record.pathname)


def quiet_orbax_info_logs() -> None:
  """Orbax logs several INFO lines per save; keep its warnings only."""
  absl_logger = py_logging.getLogger("absl")
  if not any(isinstance(f, _DropInfoFrom) for f in absl_logger.filters):
    absl_logger.addFilter(_DropInfoFrom(f"{os.sep}orbax{os.sep}"))


def train(config: ml_collections.ConfigDict, workdir: str, *,
          hooks: Sequence[loop.Hook] = ()) -> TrainResult:
  """Trains `config` in `workdir`, resuming from its latest checkpoint.

  Args:
    config: The experiment config (`configs/<family>.py`, overrides applied).
    workdir: Directory of checkpoints, metrics, TensorBoard events and the
      config (see `maxtext.trainers.workdir`).
    hooks: Extra hooks, run after the standard ones.

  Returns:
    The final state, step and last metrics.

  Raises:
    ValueError: the config is invalid (the message names the key).
    loop.NonFiniteError: the loss became NaN or infinite (names the step).
    checkpoint_lib.CheckpointError: the latest checkpoint cannot be read.
  """
  quiet_orbax_info_logs()
  experiment = ExperimentConfig.from_config_dict(config)
  workdir = os.path.abspath(workdir)
  checkpointer = checkpoint_lib.Checkpointer(
      os.path.join(workdir, workdir_lib.CHECKPOINT_DIRNAME),
      experiment.checkpoint)
  try:
    prepared = prepare(experiment, checkpointer)
  except BaseException:
    checkpointer.close()
    raise
  is_main = jax.process_index() == 0
  if is_main:
    workdir_lib.write_config(workdir, config.to_dict(),
                             step=prepared.start_step)
  total_steps = experiment.train.steps
  logging.info("Compiled the train step in %.1f s.", prepared.compile_time_s)
  if prepared.start_step >= total_steps:
    logging.warning("Nothing to train: %s is at update %d and train.steps=%d;"
                    " raise train.steps to continue.", workdir,
                    prepared.start_step, total_steps)
  else:
    logging.info("Training updates %d..%d in %s.", prepared.start_step + 1,
                 total_steps, workdir)

  log_config = experiment.logging
  metrics_hook = hooks_lib.MetricsHook(
      writers.make_writers(workdir, tensorboard=log_config.tensorboard,
                           is_main_process=is_main),
      every=log_config.every_steps, total_steps=total_steps,
      throughput=prepared.throughput)
  all_hooks = [
      metrics_hook,
      hooks_lib.CheckpointHook(
          checkpointer, every=experiment.checkpoint.every_steps,
          data_state=lambda: {"shuffle_seed": experiment.data.shuffle_seed}),
  ]
  if log_config.profile_start_step >= 0:
    all_hooks.append(hooks_lib.ProfilerHook(
        os.path.join(workdir, workdir_lib.PROFILE_DIRNAME),
        start_step=log_config.profile_start_step,
        num_steps=log_config.profile_steps))
  all_hooks.extend(hooks)

  state, step = loop.run_loop(
      prepared.state, prepared.step_fn, prepared.batches,
      start_step=prepared.start_step, total_steps=total_steps,
      hooks=all_hooks)
  return TrainResult(state=state, step=step,
                     metrics=dict(metrics_hook.last_metrics))
