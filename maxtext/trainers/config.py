"""Typed, validated experiment config, built once from the ConfigDict.

`ExperimentConfig.from_config_dict(config)` turns the `ml_collections`
config of a `configs/<family>.py` file (after command-line overrides) into
frozen dataclasses, one per section. Library code receives these, never the
ConfigDict. An unknown key is an error that names it, suggests the closest
valid one and lists them all; a missing key, or a value of the wrong plain
type (bool, int, float, str), is an error naming the key and value.
"""

from collections.abc import Mapping
import dataclasses
import difflib
import typing
from typing import Any

from maxtext.checkpoint.manager import CheckpointConfig
from maxtext.common.model_config import ModelConfig
from maxtext.data.pipeline import DataConfig
from maxtext.optim.optimizer import OptimizerConfig
from maxtext.quant.qat import QatConfig
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
    skip_nonfinite: Skip (do not apply) an update whose loss or gradient
      norm is NaN or infinite and go on; False stops the run naming the
      step. Skips are counted in `train/skipped_steps`.
    spike_zscore: Skip an update whose loss or gradient norm is more than
      this many standard deviations above the mean of the last
      `spike_window` applied updates; 0 is off.
    spike_window: Applied updates the spike statistics are taken over (and
      needed before spikes are looked for).
  """

  steps: int
  batch_size: int
  seed: int
  microbatches: int = 1
  skip_nonfinite: bool = False
  spike_zscore: float = 0.0
  spike_window: int = 100

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
    if self.spike_zscore < 0:
      raise ValueError(
          f"train.spike_zscore={self.spike_zscore!r} must be >= 0 (0 is"
          " off).")
    if self.spike_window < 1:
      raise ValueError(
          f"train.spike_window={self.spike_window!r} must be positive.")


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
    "qat": QatConfig,
    "data": DataConfig,
    "optimizer": OptimizerConfig,
    "train": TrainConfig,
    "mesh": MeshConfig,
    "sharding": ShardingConfig,
    "checkpoint": CheckpointConfig,
    "logging": LoggingConfig,
}


def _did_you_mean(unknown: list[str], valid: list[str], prefix: str) -> str:
  """` (did you mean 'x'?)` for the unknown names close to a valid one."""
  guesses = []
  for name in unknown:
    close = difflib.get_close_matches(name, valid, n=1)
    if close:
      guesses.append(f"'{prefix}{close[0]}'")
  return f" (did you mean {', '.join(guesses)}?)" if guesses else ""


def _type_error(key: str, value: Any, expected: Any) -> str | None:
  """Why `value` does not fit the plain type `expected`, or None if it does.

  Only bool, int, float and str are checked (an int is a valid float); other
  annotations are left to the section's own validation.
  """
  if expected is bool:
    ok = isinstance(value, bool)
  elif expected is int:
    ok = isinstance(value, int) and not isinstance(value, bool)
  elif expected is float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  elif expected is str:
    ok = isinstance(value, str)
  else:
    return None
  if ok:
    return None
  return (f"{key}={value!r} is a {type(value).__name__}; it must be a"
          f" {expected.__name__}.")


def build_section(name: str, cls: type[Any], values: Mapping[str, Any]) -> Any:
  """`cls(**values)`, naming unknown, missing or mistyped keys of `name`.

  Raises:
    ValueError: a key is unknown (the message suggests the closest valid one
      and lists them all), missing, or of the wrong type (names the key, the
      value and the type it must have).
  """
  if hasattr(values, "to_dict"):
    values = values.to_dict()
  fields = [f.name for f in dataclasses.fields(cls)]
  unknown = sorted(set(values) - set(fields))
  if unknown:
    keys = ", ".join(f"'{name}.{key}'" for key in unknown)
    raise ValueError(
        f"Unknown config key {keys}{_did_you_mean(unknown, fields, name + '.')}"
        f"; valid keys of '{name}': {fields}.")
  required = [f.name for f in dataclasses.fields(cls)
              if f.default is dataclasses.MISSING and
              f.default_factory is dataclasses.MISSING]
  missing = [key for key in required if key not in values]
  if missing:
    keys = ", ".join(f"'{name}.{key}'" for key in missing)
    raise ValueError(f"Missing config key {keys}; set it in the config file.")
  hints = typing.get_type_hints(cls)
  for key, value in values.items():
    error = _type_error(f"{name}.{key}", value, hints.get(key))
    if error:
      raise ValueError(error)
  return cls(**values)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
  """Every section of an experiment, typed."""

  model: ModelConfig
  qat: QatConfig
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
          f"Unknown config section(s) {unknown}"
          f"{_did_you_mean(unknown, list(SECTIONS), '')}; valid sections:"
          f" {list(SECTIONS)}.")
    missing = [name for name in SECTIONS if name not in config]
    if missing:
      raise ValueError(f"Missing config section(s) {missing}.")
    return cls(**{name: build_section(name, section_cls, config[name])
                  for name, section_cls in SECTIONS.items()})
