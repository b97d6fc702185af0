"""Typed, validated pre-training config, built once from the ConfigDict.

`ExperimentConfig.from_config_dict(config)` turns the `ml_collections`
config of a `configs/<family>.py` file (after command-line overrides) into
frozen dataclasses, one per section, through the config front door
(`maxtext.common.sections`: unknown, missing and mistyped keys, non-finite
floats and the user's paths are handled there). Library code receives
these, never the ConfigDict.
"""

from collections.abc import Mapping
import dataclasses
from typing import Any

from maxtext.checkpoint.checkpoint_config import CheckpointConfig
from maxtext.common import sections
from maxtext.common.model_config import ModelConfig
from maxtext.data.data_config import DataConfig
from maxtext.kernels.dispatch import Kernel
from maxtext.layers.pipeline import PipelineConfig
from maxtext.layers.remat import RematConfig
from maxtext.models import execution as execution_lib
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
    max_consecutive_skips: More skipped updates than this in a row stop the
      run naming them (a run that skips everything learns nothing).
  """

  steps: int
  batch_size: int
  seed: int
  microbatches: int = 1
  skip_nonfinite: bool = False
  spike_zscore: float = 0.0
  spike_window: int = 100
  max_consecutive_skips: int = 10

  def __post_init__(self):
    for name in ("steps", "batch_size", "microbatches", "spike_window",
                 "max_consecutive_skips"):
      sections.check_int(f"train.{name}", getattr(self, name), minimum=1)
    sections.check_int("train.seed", self.seed)
    sections.check_bool("train.skip_nonfinite", self.skip_nonfinite)
    sections.check_float("train.spike_zscore", self.spike_zscore, minimum=0)
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
    sections.check_int("logging.every_steps", self.every_steps, minimum=1)
    sections.check_bool("logging.tensorboard", self.tensorboard)
    sections.check_float("logging.peak_flops_per_device",
                         self.peak_flops_per_device, minimum=0)
    sections.check_int("logging.profile_start_step", self.profile_start_step,
                       minimum=-1)
    if self.profile_start_step >= 0:
      sections.check_int("logging.profile_steps", self.profile_steps,
                         minimum=1)


SECTIONS = {
    "model": ModelConfig,
    **execution_lib.SECTIONS,
    "qat": QatConfig,
    "data": DataConfig,
    "optimizer": OptimizerConfig,
    "train": TrainConfig,
    "mesh": MeshConfig,
    "sharding": ShardingConfig,
    "checkpoint": CheckpointConfig,
    "logging": LoggingConfig,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
  """Every section of an experiment, typed; the model and its execution
  sections checked together."""

  model: ModelConfig
  attention_kernel: Kernel
  pipeline: PipelineConfig
  remat: RematConfig
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
    return cls(**sections.build_sections(config, SECTIONS))

  def __post_init__(self):
    self.execution.check(self.model)

  @property
  def execution(self) -> execution_lib.Execution:
    """How the model runs (its execution sections)."""
    return execution_lib.Execution(attention_kernel=self.attention_kernel,
                                   pipeline=self.pipeline, remat=self.remat)
