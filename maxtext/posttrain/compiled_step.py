"""The sft train step compiled ahead of time: saved by `aot_compile --save`,
trained with by `sft --compiled` (`train.compiled`).

The step is the one the trainer jits otherwise (`maxtext.posttrain.step`,
through `tunix_hooks.run_our_step`). `save` writes its executable with the
fingerprint of what it was compiled for (`maxtext.aot.saved_step`): the
checkpoint's model, the `lora`, `optimizer` and `train` sections (without
the seed, the starting checkpoint's path, the checkpointing keys and
`compiled` itself), mesh, sharding, attention kernel and remat, whether the
vision tower trains, the batch (its keys and shapes), the topology and the
versions of jax, jaxlib, flax, optax, qwix and Tunix. `load` refuses a file
compiled for anything else, naming each difference. To call the executable
it lowers the trainer's own step on the trainer's model, optimizer and batch
layout (tracing only; nothing is compiled), so the loaded step is called
exactly as the jitted one would be.
"""

import dataclasses
from importlib import metadata
from typing import Any

from flax import nnx
import jax
import numpy as np
from tunix.sft import peft_trainer
from tunix.sft import sharding_utils

from maxtext.aot import saved_step
from maxtext.common.model_config import ModelConfig
from maxtext.posttrain.config import PosttrainConfig

# Distributions whose code is in the step.
_LIBRARIES = ("flax", "optax", "qwix", "google-tunix")
# Train keys that do not shape the step.
_NOT_IN_STEP = ("seed", "load", "checkpoint_every_steps", "max_checkpoints",
                "compiled")


def tunix_layout(batch: Any, mesh: jax.sharding.Mesh,
                 data_sharding_axis: tuple[Any, ...]) -> Any:
  """The abstract `batch` laid out as Tunix's `shard_input` lays out a real
  one (`sharding_utils.get_sharding`: replicated where an array has too
  few dimensions or does not divide)."""

  def place(x: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    # A zero-strided array of the shape: get_sharding reads only its shape.
    like = np.broadcast_to(np.zeros((), x.dtype), x.shape)
    return jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=sharding_utils.get_sharding(
            like, mesh=mesh,
            pspec=jax.sharding.PartitionSpec(*data_sharding_axis)))

  return jax.tree.map(place, batch)


def fingerprint(config: PosttrainConfig, model_cfg: ModelConfig,
                mesh: jax.sharding.Mesh,
                batch: dict[str, jax.ShapeDtypeStruct]) -> dict[str, Any]:
  """What the sft step of `config` on `model_cfg` (unscanned) and `mesh`,
  fed `batch`, depends on (see the module docstring)."""
  train = dataclasses.asdict(config.train)
  for key in _NOT_IN_STEP:
    del train[key]
  return saved_step.fingerprint({
      "model": model_cfg.to_dict(),
      "lora": dataclasses.asdict(config.lora),
      "optimizer": dataclasses.asdict(config.optimizer),
      "train": train,
      "mesh": dataclasses.asdict(config.mesh),
      "sharding": dataclasses.asdict(config.sharding),
      "attention_kernel": dataclasses.asdict(config.attention_kernel),
      "remat": dataclasses.asdict(config.remat),
      "train_vision": config.sft.train_vision,
      "batch": {key: [list(x.shape), str(x.dtype)]
                for key, x in sorted(batch.items())},
      "libraries": {name: metadata.version(name) for name in _LIBRARIES},
  }, mesh)


def save(path: str, compiled: jax.stages.Compiled, config: PosttrainConfig,
         model_cfg: ModelConfig, mesh: jax.sharding.Mesh,
         batch: dict[str, jax.ShapeDtypeStruct]) -> None:
  """Writes the compiled sft step of `config` (see `fingerprint`) to `path`.

  Raises:
    ValueError: the executable cannot be serialised.
  """
  saved_step.save_executable(path, compiled,
                             fingerprint(config, model_cfg, mesh, batch))


def load(path: str, config: PosttrainConfig, model_cfg: ModelConfig,
         trainer: peft_trainer.PeftTrainer, mesh: jax.sharding.Mesh,
         batch: Any) -> Any:
  """The step saved in `path`, for `trainer` (its step, model and
  optimizer, built for `config` on `model_cfg`) on `mesh`, fed batches laid
  out as `batch` (`tunix_layout`); call it within the run's mesh and rules.
  It is called as `step(model, optimizer, batch)`, like the trainer's
  jitted step.

  Raises:
    saved_step.MismatchError: `path` was compiled for another config,
      topology or versions (the message lists each difference).
    OSError: `path` cannot be read or is not a saved step.
  """
  jitted = nnx.jit(trainer.create_train_step_fn(),
                   donate_argnames=("optimizer",))
  lowered = jitted.lower(trainer.model, trainer.optimizer, batch).lowered
  executable = saved_step.load_executable(
      path, fingerprint(config, model_cfg, mesh, batch),
      lowered.in_tree, lowered.out_tree)
  return nnx.transforms.compilation.Compiled(executable, jitted)

