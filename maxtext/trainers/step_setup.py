"""What the train step is built from: layouts, optimizer, abstract state and
batch specs of an experiment on a mesh.

`pretrain.prepare` (which then restores or initialises the state and compiles)
and `maxtext.aot.compile_step` (which compiles for another target without any
data) both start here, so a step compiled ahead of time is the step `train`
runs.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from maxtext.data import pipeline
from maxtext.optim import optimizer
from maxtext.optim import update_guard
from maxtext.sharding import rules as rules_lib
from maxtext.trainers import train_state as train_state_lib
from maxtext.trainers.config import ExperimentConfig


@dataclasses.dataclass(frozen=True)
class StepInputs:
  """What the train step is built from.

  Attributes:
    rules: Parameter and compute layouts on the mesh.
    state_args: Keyword arguments of `create_train_state` (execution,
      optimizer with its update guard, schedule, mesh, rules, microbatches,
      QAT).
    abstract_state: The sharded state as `jax.ShapeDtypeStruct`s.
    batch_sharding: Layout of a [B, L] batch array.
    batch_specs: The batch as `jax.ShapeDtypeStruct`s, by key
      (`pipeline.model_keys`).
  """

  rules: rules_lib.LogicalRules
  state_args: dict[str, Any]
  abstract_state: train_state_lib.TrainState
  batch_sharding: jax.sharding.NamedSharding
  batch_specs: dict[str, jax.ShapeDtypeStruct]


def step_inputs(experiment: ExperimentConfig,
                mesh: jax.sharding.Mesh) -> StepInputs:
  """The rules, optimizer, abstract state and batch layout of `experiment`.

  Raises:
    ValueError: the batch does not divide over the mesh's batch shards and
      microbatches, or the mesh does not fit the model (names the keys).
  """
  rules = rules_lib.LogicalRules.from_config(mesh, experiment.sharding)
  train = experiment.train
  batch_shards = rules.batch_shards()
  if train.batch_size % (batch_shards * train.microbatches):
    raise ValueError(
        f"train.batch_size={train.batch_size} must be divisible by the"
        f" {batch_shards} batch shards of the mesh times"
        f" train.microbatches={train.microbatches}.")
  tx = optimizer.make_optimizer(experiment.optimizer, train.steps)
  if train.skip_nonfinite or train.spike_zscore > 0:
    tx = update_guard.skip_bad_updates(
        tx, skip_nonfinite=train.skip_nonfinite,
        spike_zscore=train.spike_zscore, spike_window=train.spike_window)
  state_args = dict(
      execution=experiment.execution, seed=train.seed, tx=tx,
      schedule=optimizer.learning_rate_schedule(experiment.optimizer,
                                                train.steps),
      z_loss=experiment.optimizer.z_loss, mesh=mesh, rules=rules,
      microbatches=train.microbatches, qat=experiment.qat,
      tokens_shape=(train.batch_size // train.microbatches,
                    experiment.data.seq_len))
  abstract_state = train_state_lib.create_train_state(
      experiment.model, abstract=True, **state_args)
  shape = (train.batch_size, experiment.data.seq_len)
  batch_sharding = rules.batch_sharding(shape)
  spec = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=batch_sharding)
  return StepInputs(
      rules=rules, state_args=state_args, abstract_state=abstract_state,
      batch_sharding=batch_sharding,
      batch_specs={key: spec for key in pipeline.model_keys(experiment.data)})
