"""Pre-training: config + workdir -> a trained, checkpointed model.

`train(config, workdir)` validates the config, restores the newest usable
checkpoint of its tiers (`workdir/checkpoints`, and the local tier
`checkpoint.local_dir` when set; parameters, optimizer state, and the data
position, so the run continues exactly where it stopped; corrupt checkpoints
are reported and skipped), otherwise initialises, then runs the loop with the
standard hooks (metrics, checkpoints per tier, preemption, profiler) plus any
given ones. On SIGTERM it stops at the next step boundary after saving a
checkpoint, and says so in `TrainResult.preempted`.

`prepare(experiment, checkpointers)` is the same setup without the loop, for
benchmarks (`tools/bench/train_bench.py`).
"""

from collections.abc import Callable, Iterator, Sequence
import dataclasses
import logging as py_logging
import os
import time
from typing import Any

from absl import logging
import jax
import ml_collections

from maxtext.checkpoint import manager as checkpoint_lib
from maxtext.checkpoint import peer
from maxtext.checkpoint import tiers
from maxtext.common import workdir as workdir_lib
from maxtext.data import pipeline
from maxtext.metrics import flops
from maxtext.metrics import goodput as goodput_lib
from maxtext.metrics import writers
from maxtext.optim import update_guard
from maxtext.sharding import mesh as mesh_lib
from maxtext.trainers import eval_step as eval_step_lib
from maxtext.trainers import hooks as hooks_lib
from maxtext.trainers import loop
from maxtext.trainers import preemption
from maxtext.trainers import step_setup
from maxtext.trainers import train_state as train_state_lib
from maxtext.trainers import train_step as train_step_lib
from maxtext.trainers import xla_options
from maxtext.trainers.config import ExperimentConfig


# Key of the data position in a checkpoint's data state.
_PIPELINE_KEY = "pipeline"


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
    data: The input pipeline behind `batches` (its position is saved with
      checkpoints).
    evaluate: `state -> eval/* metrics` over the evaluation split; None when
      `data.eval_every_steps` is 0.
  """

  state: train_state_lib.TrainState
  start_step: int
  batches: Iterator[dict[str, jax.Array]]
  step_fn: Any
  compile_time_s: float
  throughput: hooks_lib.Throughput
  mesh: jax.sharding.Mesh
  data: pipeline.Pipeline
  evaluate: Callable[[train_state_lib.TrainState], dict[str, float]] | None


@dataclasses.dataclass(frozen=True)
class TrainResult:
  """What `train` returns.

  Attributes:
    state: The final state.
    step: Updates done in total.
    metrics: The last written metrics (empty if nothing was trained).
    preempted: The run stopped early on SIGTERM (after checkpointing `step`).
  """

  state: train_state_lib.TrainState
  step: int
  metrics: dict[str, float | None]
  preempted: bool = False


def _device_batches(mesh, sharding, local_batches,
                    keys: Sequence[str]) -> Iterator[dict[str, jax.Array]]:
  for local_batch in local_batches:
    yield mesh_lib.batch_to_device(
        mesh, {key: local_batch[key] for key in keys}, sharding)


# (experiment, mesh, state, batch specs) -> the compiled train step, e.g. one
# loaded from `aot_compile --save` (`maxtext.aot.saved_step.load_compiled`).
CompileFn = Callable[[ExperimentConfig, jax.sharding.Mesh, Any,
                      dict[str, jax.ShapeDtypeStruct]], Any]


def _nonfinite(tree) -> str | None:
  """Why a restored state is unusable: it holds NaN or infinite values
  (treated like a corrupt checkpoint)."""
  if bool(jax.jit(train_state_lib.all_finite)(tree)):
    return None
  return "holds NaN or infinite values"


def _guard_switched(saved: Any, wanted: dict[str, Any]):
  """A `checkpoint.Migration`: resumes with the update guard switched on or
  off, or its window resized, since the checkpoint was saved."""
  target, convert = update_guard.restore_target(saved["opt_state"],
                                                wanted["opt_state"])
  return ({**wanted, "opt_state": target},
          lambda tree: {**tree, "opt_state": convert(tree["opt_state"])})


def prepare(experiment: ExperimentConfig,
            checkpointers: Sequence[checkpoint_lib.Checkpointer] = (), *,
            compile_fn: CompileFn | None = None) -> Prepared:
  """Builds the mesh, state (restored from the newest usable checkpoint of
  `checkpointers`, if any), data and compiled step of `experiment` (by
  `compile_fn` when given, else by compiling `train_step`)."""
  mesh = mesh_lib.make_mesh(experiment.mesh)
  inputs = step_setup.step_inputs(experiment, mesh)
  batch_size = experiment.train.batch_size
  model_config = experiment.model

  start_step = 0
  data_state = None
  abstract = inputs.abstract_state
  restored = tiers.restore_newest(
      list(checkpointers), abstract.checkpoint_tree(), check=_nonfinite,
      migrate=_guard_switched)
  if restored is not None:
    state = abstract.replace_checkpoint_tree(restored.state)
    data_state = restored.data_state
    start_step = int(data_state["next_step"])
    logging.info("Restored %s: resuming after update %d.", restored.path,
                 start_step)
  else:
    state = train_state_lib.create_train_state(model_config,
                                               **inputs.state_args)

  processes = dict(process_index=jax.process_index(),
                   process_count=jax.process_count())
  data = pipeline.make_train_pipeline(
      experiment.data, batch_size=batch_size,
      vocab_size=model_config.vocab_size, **processes)
  if data_state is not None:
    if _PIPELINE_KEY not in data_state:
      raise ValueError(
          f"Checkpoint {restored.path} has no data pipeline position (saved"
          " by an older version); resume it with that version or start a new"
          " workdir.")
    data.restore_checkpoint_state(data_state[_PIPELINE_KEY])
  seq_len = experiment.data.seq_len
  batch_sharding = inputs.batch_sharding
  batches = _device_batches(mesh, batch_sharding, data, data.model_keys)
  # The state's initialization or restore runs asynchronously: it finishes
  # before the compile's clock starts, so that init and compile seconds are
  # each their own (both contend for the same CPU cores otherwise).
  jax.block_until_ready(state)
  start = time.perf_counter()
  if compile_fn is None:
    step_fn = xla_options.compile_for(
        train_step_lib.train_step.lower(state, inputs.batch_specs), mesh)
  else:
    step_fn = compile_fn(experiment, mesh, state, inputs.batch_specs)
  compile_time_s = time.perf_counter() - start

  evaluate = None
  if experiment.data.eval_every_steps:

    def evaluate(state):
      local = pipeline.eval_batches(
          experiment.data, batch_size=batch_size,
          vocab_size=model_config.vocab_size, **processes)
      return eval_step_lib.evaluate(state, _device_batches(
          mesh, batch_sharding, local, pipeline.MODEL_KEYS))

  throughput = hooks_lib.Throughput(
      tokens_per_step=batch_size * seq_len, num_devices=mesh.size,
      flops_per_token=flops.training_flops_per_token(
          model_config, seq_len, experiment.attention_kernel.linear_chunk),
      peak_flops_per_device=flops.peak_flops_per_device(
          override=experiment.logging.peak_flops_per_device))
  return Prepared(state=state, start_step=start_step, batches=batches,
                  step_fn=step_fn, compile_time_s=compile_time_s,
                  throughput=throughput, mesh=mesh, data=data,
                  evaluate=evaluate)


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


def make_checkpointers(workdir: str, experiment: ExperimentConfig
                       ) -> list[checkpoint_lib.Checkpointer]:
  """The checkpoint tiers of a run of `experiment` in `workdir`, fastest
  first.

  Raises:
    ValueError: `checkpoint.local_dir` leaves the workdir or is the
      persistent tier's folder; `checkpoint.local_peers` on a mesh where a
      process holds no replica apart from the others.
  """
  config = experiment.checkpoint
  persistent_dir = os.path.join(workdir, workdir_lib.CHECKPOINT_DIRNAME)
  local_dir = config.local_dir and workdir_lib.output_path(
      workdir, config.local_dir, key="checkpoint.local_dir")
  if local_dir and os.path.commonpath([local_dir, persistent_dir]) in (
      local_dir, persistent_dir):
    raise ValueError(
        f"checkpoint.local_dir={config.local_dir!r} overlaps the persistent"
        f" checkpoints in {persistent_dir}; name another folder.")
  tiers = [checkpoint_lib.Checkpointer(
      persistent_dir, max_to_keep=config.max_to_keep,
      async_save=config.async_save, tier="persistent")]
  if local_dir and config.local_peers:
    mesh = mesh_lib.make_mesh(experiment.mesh)
    peer.check_mesh(mesh, zero1=experiment.sharding.zero1)
    tiers.insert(0, peer.PeerCheckpointer(
        local_dir, mesh, max_to_keep=config.local_max_to_keep,
        async_save=config.async_save))
  elif local_dir:
    tiers.insert(0, checkpoint_lib.Checkpointer(
        local_dir, max_to_keep=config.local_max_to_keep,
        async_save=config.async_save, tier="local"))
  return tiers


def train(config: ml_collections.ConfigDict, workdir: str, *,
          hooks: Sequence[loop.Hook] = (),
          compile_fn: CompileFn | None = None) -> TrainResult:
  """Trains `config` in `workdir`, resuming from its latest checkpoint.

  Args:
    config: The experiment config (`configs/<family>.py`, overrides applied).
    workdir: Directory of checkpoints, metrics, TensorBoard events and the
      config (see `maxtext.common.workdir`).
    hooks: Extra hooks, run after the standard ones.
    compile_fn: Gives the train step instead of compiling it (see `prepare`).

  Returns:
    The final state, step and last metrics, and whether SIGTERM stopped it.

  Raises:
    ValueError: the config is invalid (the message names the key).
    loop.NonFiniteError: the loss became NaN or infinite (names the step).
    checkpoint_lib.CheckpointError: there are checkpoints but none is usable,
      one holds another model, or a save failed (names the step and path).
    workdir_lib.WorkdirBusyError: another run holds the workdir (names its
      pid and host).
  """
  quiet_orbax_info_logs()
  experiment = ExperimentConfig.from_config_dict(config)
  workdir = os.path.abspath(workdir)
  is_main = jax.process_index() == 0
  # One run per workdir, from before its checkpoint managers clean up.
  with workdir_lib.exclusive(workdir, take=is_main):
    return _train(experiment, config, workdir, is_main=is_main, hooks=hooks,
                  compile_fn=compile_fn)


def _train(experiment: ExperimentConfig, config: ml_collections.ConfigDict,
           workdir: str, *, is_main: bool, hooks: Sequence[loop.Hook],
           compile_fn: CompileFn | None) -> TrainResult:
  """`train` in the workdir it holds."""
  recorder = goodput_lib.GoodputRecorder(workdir, write=is_main)
  checkpointers = make_checkpointers(workdir, experiment)
  try:
    prepared = prepare(experiment, checkpointers, compile_fn=compile_fn)
  except BaseException:
    for checkpointer in checkpointers:
      checkpointer.close()
    recorder.close()
    raise
  recorder.add("compile", prepared.compile_time_s)
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

  def data_state():
    return {_PIPELINE_KEY: prepared.data.checkpoint_state()}

  *local_tier, persistent_tier = checkpointers
  preemption_hook = preemption.PreemptionHook()
  all_hooks = [
      metrics_hook,
      goodput_lib.TimedHook(hooks_lib.CheckpointHook(
          persistent_tier, every=experiment.checkpoint.every_steps,
          every_seconds=60 * experiment.checkpoint.every_minutes,
          data_state=data_state), recorder, "checkpoint"),
      *(goodput_lib.TimedHook(hooks_lib.CheckpointHook(
          tier, every=experiment.checkpoint.local_every_steps,
          data_state=data_state, save_at_end=False), recorder, "checkpoint")
        for tier in local_tier),
      preemption_hook,
      hooks_lib.SkipLimit(experiment.train.max_consecutive_skips),
  ]
  if log_config.profile_start_step >= 0:
    all_hooks.append(hooks_lib.ProfilerHook(
        os.path.join(workdir, workdir_lib.PROFILE_DIRNAME),
        start_step=log_config.profile_start_step,
        num_steps=log_config.profile_steps))
  if prepared.evaluate is not None:
    all_hooks.append(goodput_lib.TimedHook(hooks_lib.EvalHook(
        prepared.evaluate, metrics_hook.writer,
        every=experiment.data.eval_every_steps), recorder, "eval"))
  all_hooks.extend(hooks)
  # Last: the other hooks' end-of-run work (the final save) is counted.
  all_hooks.append(goodput_lib.GoodputHook(
      recorder, writer=metrics_hook.writer, every=log_config.every_steps))

  try:
    state, step = loop.run_loop(
        prepared.state, prepared.step_fn,
        recorder.timed_batches(prepared.batches),
        start_step=prepared.start_step, total_steps=total_steps,
        hooks=all_hooks)
  finally:
    prepared.data.close()
  return TrainResult(state=state, step=step,
                     metrics=dict(metrics_hook.last_metrics),
                     preempted=preemption_hook.preempted_at is not None)
