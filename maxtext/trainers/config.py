"""Typed, validated experiment config, built once from the ConfigDict.

`ExperimentConfig.from_config_dict(config)` turns the `ml_collections`
config of a `configs/<family>.py` file (after command-line overrides) into
frozen dataclasses, one per section. Library code receives these, never the
ConfigDict. An unknown or missing key is an error that names the key and
lists the valid ones.
"""

from collections.abc import Mapping
import dataclasses
from typing import Any

from maxtext.checkpoint.manager import CheckpointConfig
from maxtext.common.model_config import ModelConfig
from maxtext.data.pipeline import DataConfig
from maxtext.optim.optimizer import OptimizerConfig
from maxtext.sharding.mesh import MeshConfig
from maxtext.sharding.rules import ShardingConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
  """The `train` config section.

  Attributes:
    steps: Total number of updates of the run.
    batch_size: Global batch size (sequences per update).
    seed: Seed of the parameter initialisation.
    microbatches: Gradient accumulation: each update runs the batch in this
      many slices (inside one jitted step) and applies their summed
      gradients; divides `batch_size`.
  """

  steps: int
  batch_size: int
  seed: int
  microbatches: int = 1

  def __post_init__(self):
    if self.steps < 1:
      raise ValueError(f"train.steps={self.steps!r} must be positive.")
    if self.batch_size < 1:
      raise ValueError(
          f"train.batch_size={self.batch_size!r} must be positive.")
    if isinstance(self.microbatches, bool) or not isinstance(
        self.microbatches, int) or self.microbatches < 1:
      raise ValueError(
          f"train.microbatches={self.microbatches!r} must be a positive"
          " integer.")
    if self.batch_size % self.microbatches:
      raise ValueError(
          f"train.microbatches={self.microbatches} must divide"
          f" train.batch_size={self.batch_size}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoggingConfig:
  """The `logging` config section.

  Attributes:
    every_steps: Write metrics every this many updates (and at the first and
      last update).
    tensorboard: Also write TensorBoard event files.
    peak_flops_per_device: Peak FLOP/s of one device for MFU; 0 looks it up
      by device kind (unknown kinds report MFU as n/a).
    profile_start_step: First update traced by the profiler; -1 is off.
    profile_steps: Number of updates traced.
  """

  every_steps: int
  tensorboard: bool
  peak_flops_per_device: float
  profile_start_step: int
  profile_steps: int

  def __post_init__(self):
    if self.every_steps < 1:
      raise ValueError(
          f"logging.every_steps={self.every_steps!r} must be positive.")
    if self.peak_flops_per_device < 0:
      raise ValueError(
          "logging.peak_flops_per_device="
          f"{self.peak_flops_per_device!r} must be >= 0.")
    if self.profile_start_step >= 0 and self.profile_steps < 1:
      raise ValueError(
          f"logging.profile_steps={self.profile_steps!r} must be positive.")


SECTIONS = {
    "model": ModelConfig,
    "data": DataConfig,
    "optimizer": OptimizerConfig,
    "train": TrainConfig,
    "mesh": MeshConfig,
    "sharding": ShardingConfig,
    "checkpoint": CheckpointConfig,
    "logging": LoggingConfig,
}


def build_section(name: str, cls: type[Any], values: Mapping[str, Any]) -> Any:
  """`cls(**values)`, naming unknown or missing keys of section `name`.

  Raises:
    ValueError: a key is unknown or missing; the message names it and lists
      the valid keys.
  """
  if hasattr(values, "to_dict"):
    values = values.to_dict()
  fields = [f.name for f in dataclasses.fields(cls)]
  unknown = sorted(set(values) - set(fields))
  if unknown:
    keys = ", ".join(f"'{name}.{key}'" for key in unknown)
    raise ValueError(
        f"Unknown config key {keys}; valid keys of '{name}': {fields}.")
  required = [f.name for f in dataclasses.fields(cls)
              if f.default is dataclasses.MISSING and
              f.default_factory is dataclasses.MISSING]
  missing = [key for key in required if key not in values]
  if missing:
    keys = ", ".join(f"'{name}.{key}'" for key in missing)
    raise ValueError(f"Missing config key {keys}; set it in the config file.")
  return cls(**values)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
  """Every section of an experiment, typed."""

  model: ModelConfig
  data: DataConfig
  optimizer: OptimizerConfig
  train: TrainConfig
  mesh: MeshConfig
  sharding: ShardingConfig
  checkpoint: CheckpointConfig
  logging: LoggingConfig

  @classmethod
  def from_config_dict(cls, config: Mapping[str, Any]) -> "ExperimentConfig":
    """Builds and validates every section of `config`.

    Raises:
      ValueError: a section or key is unknown or missing, or a value is
        invalid; the message names it.
    """
    if hasattr(config, "to_dict"):
      config = config.to_dict()
    unknown = sorted(set(config) - set(SECTIONS))
    if unknown:
      raise ValueError(
          f"Unknown config section(s) {unknown}; valid sections:"
          f" {list(SECTIONS)}.")
    missing = [name for name in SECTIONS if name not in config]
    if missing:
      raise ValueError(f"Missing config section(s) {missing}.")
    return cls(**{name: build_section(name, section_cls, config[name])
                  for name, section_cls in SECTIONS.items()})
