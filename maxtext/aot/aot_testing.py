"""Test helper: a train step compiled for a target named as `aot_compile`'s
`--topology` (v5e:2x2, cpu:8, h200:8, ...), with its report."""

from maxtext.aot import compile_step
from maxtext.aot import topology
from maxtext.trainers.config import ExperimentConfig


def compile_for(
    experiment: ExperimentConfig, topology_name: str
) -> tuple[compile_step.CompiledStep, compile_step.StepReport]:
  """`experiment`'s train step compiled for the target `topology_name`, and
  `compile_step.analyse`'s report of it.

  Raises:
    ValueError: as `topology.hardware_for` (a bad or unmakeable target) and
      `compile_step.compile_train_step` (`DoesNotFitError`, a config that
      does not fit the mesh).
  """
  step = compile_step.compile_train_step(
      experiment, topology.hardware_for(topology_name))
  return step, compile_step.analyse(step, experiment)
