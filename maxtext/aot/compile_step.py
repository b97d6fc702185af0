"""Compiles the train step for a target and reports its memory, FLOPs and
collectives.

`compile_train_step(experiment, hardware)` builds the mesh on the target's
devices (compile-only TPU devices need no TPU), then the same sharding rules,
optimizer, abstract sharded state and batch layout as `train`
(`maxtext.trainers.step_setup`, which needs no data), and lowers and compiles
`train_step`. `analyse` reads per device from the compiled program:
  memory      argument, output, aliased (donated state reused for the new
              state), temporary and generated-code bytes; the total,
              arguments + outputs - aliased + temporaries + code, against
              the device's memory;
  FLOPs       XLA's cost analysis (for scanned layers extrapolated from
              two shorter unrolled models: `xla_costs`) next to ours
              (`maxtext.metrics.flops`, divided over the devices);
  step time   XLA's estimate (`optimal_seconds`) where the backend gives
              one, else the roofline max(FLOPs / peak, bytes / bandwidth)
              of XLA's counts, else n/a (CPU); collectives not included;
  collectives the all-reduce, all-gather, reduce-scatter, all-to-all,
              collective-permute and collective-broadcast ops in the
              program.
A program that does not fit raises `DoesNotFitError` (at compile time on
TPU, whose compiler checks HBM itself; from the totals elsewhere).
"""

import collections
import dataclasses
import re
import time

import jax

from maxtext.aot import topology as topology_lib
from maxtext.common import layer_pattern
from maxtext.common.model_config import ModelConfig
from maxtext.metrics import flops
from maxtext.sharding import mesh as mesh_lib
from maxtext.trainers import step_setup
from maxtext.trainers import train_step as train_step_lib
from maxtext.trainers.config import ExperimentConfig

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
               "collective-permute", "collective-broadcast")
# An op (its async "-start" half counted once), not its name or "-done".
_COLLECTIVE_RE = re.compile(
    r"\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_GIB = 2**30
# What `xla_costs` reads from XLA's cost analysis (optimal_seconds: TPU's
# estimated time; absent or negative where unknown).
_COST_KEYS = ("flops", "bytes accessed", "optimal_seconds")

FIT_HINT = (
    "Shard the state over more devices (--config.mesh.ici.fsdp, a larger"
    " --topology), lower --config.train.batch_size or raise"
    " --config.train.microbatches, recompute activations"
    " (--config.remat.policy=full), or rank layouts with --sweep.")


class DoesNotFitError(ValueError):
  """The train step needs more memory than a device has."""


@dataclasses.dataclass(frozen=True)
class CompiledStep:
  """A compiled train step and what it was built from.

  Attributes:
    compiled: The executable; on CPU and GPU targets it runs here, on
      `inputs.abstract_state`-shaped states and `inputs.batch_specs` batches.
    hardware: The target's devices.
    mesh: The mesh on them.
    inputs: The state and batch layout (None for the sft step:
      `maxtext.aot.compile_sft`).
    compile_time_s: Seconds to lower and compile.
  """

  compiled: jax.stages.Compiled
  hardware: topology_lib.Hardware
  mesh: jax.sharding.Mesh
  inputs: step_setup.StepInputs
  compile_time_s: float


def _gib(num_bytes: float) -> str:
  return f"{num_bytes / _GIB:.2f} GiB"


def compile_train_step(experiment: ExperimentConfig,
                       hardware: topology_lib.Hardware,
                       compiler_options: dict | None = None) -> CompiledStep:
  """Lowers and compiles the train step of `experiment` for `hardware`
  (`compiler_options`: see `compile_lowered`).

  Raises:
    DoesNotFitError: the TPU compiler ran out of HBM (the message has its
      usage summary).
    ValueError: the config does not fit the mesh.
  """
  mesh = mesh_lib.make_mesh(experiment.mesh, hardware.devices)
  inputs = step_setup.step_inputs(experiment, mesh)
  start = time.perf_counter()
  lowered = train_step_lib.train_step.lower(inputs.abstract_state,
                                            inputs.batch_specs)
  compiled = compile_lowered(lowered, hardware, compiler_options)
  return CompiledStep(compiled=compiled, hardware=hardware, mesh=mesh,
                      inputs=inputs,
                      compile_time_s=time.perf_counter() - start)


def compile_lowered(lowered: jax.stages.Lowered,
                    hardware: topology_lib.Hardware,
                    compiler_options: dict | None = None
                    ) -> jax.stages.Compiled:
  """`lowered.compile(compiler_options)` (XLA debug options, e.g.
  `xla_dump_to`), naming an out-of-memory error of the compiler.

  Raises:
    DoesNotFitError: the TPU compiler ran out of HBM (the message has its
      usage summary).
  """
  try:
    return lowered.compile(compiler_options)
  except jax.errors.JaxRuntimeError as e:
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    # The compiler's first line says how much was needed and is available.
    summary = " ".join(str(e).splitlines()[0].split())
    raise DoesNotFitError(
        f"The train step does not fit in the {_gib(hardware.memory_bytes)} of"
        f" {hardware.memory_name} per device on {hardware.target.name}:"
        f" {summary} {FIT_HINT}") from e


@dataclasses.dataclass(frozen=True)
class StepReport:
  """Per-device memory, FLOPs, time and collectives of a compiled step.

  Attributes:
    argument_bytes: Inputs (state and batch).
    output_bytes: Outputs (new state and metrics).
    alias_bytes: Outputs written into donated inputs (counted once).
    temp_bytes: Temporaries (activations, gradients, scratch).
    code_bytes: Generated code.
    host_bytes: Host-memory arguments, outputs and temporaries (offloaded
      optimizer state or activations), not part of `total_bytes`.
    memory_bytes: What one device has.
    memory_name: What that memory is.
    xla_flops: FLOPs of one device's program (XLA cost analysis).
    model_flops: Our training FLOPs of one step, per device.
    bytes_accessed: Memory traffic of one device's program (XLA).
    cost_source: How `xla_flops` and `bytes_accessed` were found.
    step_time_s: Estimated seconds per step; None when unknown.
    step_time_source: Where `step_time_s` comes from.
    collectives: Count of each collective op kind in the program.
  """

  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  code_bytes: int
  host_bytes: int
  memory_bytes: int
  memory_name: str
  xla_flops: float
  model_flops: float
  bytes_accessed: float
  cost_source: str
  step_time_s: float | None
  step_time_source: str
  collectives: dict[str, int]

  @property
  def total_bytes(self) -> int:
    return (self.argument_bytes + self.output_bytes - self.alias_bytes +
            self.temp_bytes + self.code_bytes)

  @property
  def fits(self) -> bool:
    return self.total_bytes <= self.memory_bytes


def collective_counts(hlo_text: str) -> dict[str, int]:
  """Collective ops in compiled HLO text, by kind (kinds present only)."""
  counts = collections.Counter(_COLLECTIVE_RE.findall(hlo_text))
  return {kind: counts[kind] for kind in COLLECTIVES if counts[kind]}


def _costs(compiled: jax.stages.Compiled) -> dict[str, float]:
  cost = compiled.cost_analysis() or {}
  return {key: float(cost.get(key, 0.0)) for key in _COST_KEYS}


def xla_costs_of(compiled: jax.stages.Compiled
                 ) -> tuple[dict[str, float], str]:
  """XLA's per-device costs of `compiled` as it is (an unscanned model's
  step: every layer counted) and where they come from."""
  return _costs(compiled), "XLA cost analysis"


def _unrolled_depths(model: ModelConfig) -> tuple[int, int, int] | None:
  """(n1, n2, repeats): XLA's cost of `model` is cost(n1) + repeats *
  (cost(n2) - cost(n1)), with cost(n) that of its first n layers unrolled;
  None when no two shorter prefixes give it.

  Past a first stretch of `start` layers (DeepSeek's dense layers) the layer
  pattern repeats with some period p (Gemma 3: 6, one local kind and one
  global; Llama 4: dense and expert layers alternating). A model of n layers
  has the first n layers of the full one, so cost(n1 + p) - cost(n1) is one
  period's cost when n1 >= start; n1 is the shortest valid depth that leaves
  whole periods to the end.
  """
  full = layer_pattern.layers(model)
  count = len(full)

  def start_of(period):  # First layer from which `full` repeats by period.
    start = count - period
    while start > 0 and full[start - 1] == full[start - 1 + period]:
      start -= 1
    return start

  start, period = min(((start_of(p), p) for p in range(1, count)),
                      key=lambda sp: sp[0] + 2 * sp[1], default=(0, count))
  n1 = start + (count - start) % period
  while n1 < count:
    try:
      short = dataclasses.replace(model, num_layers=n1)
    except ValueError:  # E.g. no layer past the first dense ones.
      n1 += period
      continue
    if layer_pattern.layers(short) != full[:n1]:
      return None
    break
  if n1 + period > count:
    return None
  return n1, n1 + period, (count - n1) // period


def xla_costs(step: CompiledStep,
              experiment: ExperimentConfig) -> tuple[dict[str, float], str]:
  """XLA's per-device FLOPs, bytes accessed and time of one step.

  XLA's cost analysis counts the body of a loop once, so with scanned
  layers it sees one group of layers. The cost of all layers is then
  extrapolated from two programs of fewer unrolled layers (otherwise the
  same, on the same devices) that differ by one period of the layer pattern
  (`_unrolled_depths`): 1 and 2 layers for a model of one layer kind.

  Returns:
    (costs by `_COST_KEYS`, how they were found).
  """
  model = experiment.model
  if not model.scan_layers or model.num_layers == 1:
    return xla_costs_of(step.compiled)
  depths = _unrolled_depths(model)
  if experiment.pipeline.stages > 1 or depths is None:
    return (_costs(step.compiled),
            "XLA cost analysis, which counts the scanned layers once")
  n1, n2, repeats = depths
  one, two = (
      _costs(compile_train_step(dataclasses.replace(
          experiment, model=dataclasses.replace(
              model, num_layers=layers, scan_layers=False)),
                                step.hardware).compiled)
      for layers in (n1, n2))
  costs = {key: one[key] + repeats * (two[key] - one[key])
           for key in _COST_KEYS}
  if min(one["optimal_seconds"], two["optimal_seconds"]) <= 0:
    costs["optimal_seconds"] = 0.0  # Unknown.
  return costs, (f"XLA cost analysis of {n1} and {n2} unrolled layers, "
                 "extrapolated")


def analyse(step: CompiledStep, experiment: ExperimentConfig) -> StepReport:
  """Memory, FLOPs, estimated time and collectives of `step`, per device.

  With scanned layers this compiles two shorter unrolled variants for the
  FLOPs and time (see `xla_costs`).
  """
  return report(step, experiment.model, experiment.train.batch_size,
                experiment.data.seq_len, *xla_costs(step, experiment))


def report(step: CompiledStep, model: ModelConfig, rows: int, seq_len: int,
           costs: dict[str, float], cost_source: str, *,
           extra_flops: float = 0.0) -> StepReport:
  """The `StepReport` of `step`, which trains `model` on `rows` sequences
  of `seq_len` tokens per step (and `extra_flops` more per step: a vision
  tower's images), with XLA's `costs` (see `xla_costs`)."""
  memory = step.compiled.memory_analysis()
  hardware = step.hardware
  model_flops = (flops.training_flops_per_token(model, seq_len) * rows *
                 seq_len + extra_flops) / step.mesh.size
  step_time, time_source = None, "n/a (no peak FLOP/s or bandwidth known)"
  if not costs["flops"] and not costs["bytes accessed"]:
    # Compile-only GPUs: XLA gives no cost analysis.
    cost_source = "n/a: XLA gives no cost analysis for this target"
    time_source = "n/a (no cost analysis)"
  if costs["optimal_seconds"] > 0:
    step_time, time_source = costs["optimal_seconds"], cost_source
  elif (hardware.peak_flops and hardware.memory_bandwidth and
        costs["flops"]):
    step_time = max(costs["flops"] / hardware.peak_flops,
                    costs["bytes accessed"] / hardware.memory_bandwidth)
    time_source = f"roofline of the FLOPs and bytes of {cost_source}"
  return StepReport(
      argument_bytes=memory.argument_size_in_bytes,
      output_bytes=memory.output_size_in_bytes,
      alias_bytes=memory.alias_size_in_bytes,
      temp_bytes=memory.temp_size_in_bytes,
      code_bytes=memory.generated_code_size_in_bytes,
      host_bytes=(memory.host_argument_size_in_bytes +
                  memory.host_output_size_in_bytes -
                  memory.host_alias_size_in_bytes +
                  memory.host_temp_size_in_bytes),
      memory_bytes=hardware.memory_bytes, memory_name=hardware.memory_name,
      xla_flops=costs["flops"], model_flops=model_flops,
      bytes_accessed=costs["bytes accessed"], cost_source=cost_source,
      step_time_s=step_time, step_time_source=time_source,
      collectives=collective_counts(step.compiled.as_text()))


def check_fits(report: StepReport, target_name: str) -> None:
  """Raises `DoesNotFitError` when the step needs more than a device has."""
  if not report.fits:
    raise DoesNotFitError(
        f"The train step needs {_gib(report.total_bytes)} per device on"
        f" {target_name}, {_gib(report.total_bytes - report.memory_bytes)}"
        f" more than the {_gib(report.memory_bytes)} of {report.memory_name}."
        f" {FIT_HINT}")


def format_report(report: StepReport, step: CompiledStep,
                  title: str = "Train step") -> str:
  """The memory table and the FLOPs, time and collectives lines, under
  "`title` on <target>: ..."."""
  hardware = step.hardware
  mesh = " ".join(f"{name}={size}" for name, size in step.mesh.shape.items()
                  if size > 1) or "one device"
  rows = [("arguments", report.argument_bytes),
          ("outputs", report.output_bytes),
          ("aliased (donated)", -report.alias_bytes),
          ("temporaries", report.temp_bytes),
          ("generated code", report.code_bytes),
          ("total", report.total_bytes),
          (hardware.memory_name, report.memory_bytes)]
  width = max(len(name) for name, _ in rows)
  lines = [f"{title} on {hardware.target.name}: {len(hardware.devices)} x"
           f" {hardware.device_kind}, mesh {mesh}; compiled in"
           f" {step.compile_time_s:.1f} s.",
           f"{'per device'.ljust(width)}  {'bytes':>16}  {'GiB':>8}"]
  lines += [f"{name.ljust(width)}  {value:>16,}  {value / _GIB:>8.2f}"
            for name, value in rows]
  share = report.total_bytes / report.memory_bytes
  verdict = "fits" if report.fits else "DOES NOT FIT"
  lines.append(f"{verdict}: {share:.1%} of {hardware.memory_name}.")
  if report.host_bytes:
    lines.append(f"host memory (offloaded): {_gib(report.host_bytes)}.")
  ratio = (f" (XLA / ours {report.xla_flops / report.model_flops:.2f})"
           if report.model_flops and report.xla_flops else "")
  lines.append(f"FLOPs per device per step: XLA {report.xla_flops:.4g}, ours"
               f" {report.model_flops:.4g}{ratio}; bytes accessed"
               f" {report.bytes_accessed:.4g} ({report.cost_source}).")
  if report.step_time_s is None:
    lines.append(f"Estimated step time: {report.step_time_source}.")
  else:
    mfu = ""
    if hardware.peak_flops:
      utilization = (report.model_flops / report.step_time_s /
                     hardware.peak_flops)
      mfu = f", MFU {utilization:.0%}"
    lines.append(f"Estimated step time: {report.step_time_s * 1e3:.1f} ms"
                 f" ({report.step_time_source}{mfu}).")
  collectives = ", ".join(f"{kind} x{count}"
                          for kind, count in report.collectives.items())
  lines.append(f"Collectives: {collectives or 'none'}.")
  return "\n".join(lines) + "\n"
