"""Ranks mesh layouts and remat policies for a target by compiling each.

`sweep(experiment, hardware, layouts, remat_policies)` compiles the train
step for every (ICI layout, remat policy) pair on the target's devices
(`compile_step`), and ranks the results: steps that fit first, fastest
estimated step time first (XLA's cost analysis; see `compile_step.analyse`),
then those that do not fit by memory, then the pairs that are invalid for the
config (e.g. a batch that does not divide over the layout) with the reason.
The estimate counts compute and memory traffic, not the time of collectives,
so read it as a first ranking to measure from, not a prediction.
"""

from collections.abc import Sequence
import dataclasses
import math

from maxtext.aot import compile_step
from maxtext.aot import topology as topology_lib
from maxtext.layers import remat
from maxtext.sharding import mesh as mesh_lib
from maxtext.trainers.config import ExperimentConfig

DEFAULT_REMAT_POLICIES = ("none", "save_dot_except_mlp", "full")
_GIB = 2**30


def parse_layout(text: str) -> dict[str, int]:
  """"fsdp=4,tensor=2" -> ICI sizes of every mesh axis (1 unless named).

  Raises:
    ValueError: an entry is not axis=size or names an unknown axis.
  """
  sizes = dict.fromkeys(mesh_lib.AXES, 1)
  for entry in text.split(","):
    name, _, value = entry.strip().partition("=")
    if name not in sizes or not value.strip().lstrip("-").isdigit():
      raise ValueError(
          f"Layout entry {entry.strip()!r} of {text!r} is not axis=size with"
          f" an axis of {mesh_lib.AXES}, e.g. fsdp=4,tensor=2.")
    sizes[name] = int(value)
  return sizes


def default_layouts(experiment: ExperimentConfig,
                    devices_per_slice: int) -> list[dict[str, int]]:
  """FSDP over a slice, and FSDP with tensor or data parallelism.

  Tensor sizes 2, 4, 8 that divide the query and key/value heads; data
  sizes 2, 4 that leave FSDP at least 2 devices.
  """
  model = experiment.model
  layouts = [parse_layout(f"fsdp={devices_per_slice}")]
  for tensor in (2, 4, 8):
    if (devices_per_slice % tensor == 0 and tensor < devices_per_slice and
        model.attention.num_heads % tensor == 0 and
        model.attention.num_kv_heads % tensor == 0):
      layouts.append(parse_layout(
          f"fsdp={devices_per_slice // tensor},tensor={tensor}"))
  for data in (2, 4):
    if devices_per_slice % data == 0 and devices_per_slice // data >= 2:
      layouts.append(parse_layout(
          f"data={data},fsdp={devices_per_slice // data}"))
  return layouts


@dataclasses.dataclass(frozen=True)
class SweepRow:
  """One compiled candidate.

  Attributes:
    layout: ICI size of every mesh axis.
    remat_policy: The run's remat policy (`remat.policy`).
    report: Its memory, FLOPs and time; None when it did not compile.
    error: Why it did not compile.
    out_of_memory: It did not compile because it does not fit (the TPU
      compiler checks that itself); otherwise the pair is invalid for the
      config.
  """

  layout: dict[str, int]
  remat_policy: str
  report: compile_step.StepReport | None
  error: str = ""
  out_of_memory: bool = False

  @property
  def fits(self) -> bool:
    return self.report is not None and self.report.fits

  def layout_text(self) -> str:
    return ",".join(f"{name}={size}" for name, size in self.layout.items()
                    if size > 1) or "one device"


def rank(rows: Sequence[SweepRow]) -> list[SweepRow]:
  """Fitting rows by estimated step time (unknown last), then the rows that
  do not fit by memory, then those out of memory at compile time, then the
  invalid ones."""

  def key(row: SweepRow) -> tuple[int, float]:
    if row.fits:
      time = row.report.step_time_s
      return (0, math.inf if time is None else time)
    if row.report is not None:
      return (1, row.report.total_bytes)
    return (2 if row.out_of_memory else 3, 0)

  return sorted(rows, key=key)


def sweep(experiment: ExperimentConfig, hardware: topology_lib.Hardware,
          layouts: Sequence[dict[str, int]],
          remat_policies: Sequence[str]) -> list[SweepRow]:
  """Compiles every layout x remat policy; returns the rows, best first.

  The config's DCN sizes are kept; each layout replaces its ICI sizes.

  Raises:
    ValueError: a remat policy is unknown (names the valid ones).
  """
  unknown = [p for p in remat_policies if p not in remat.POLICIES]
  if unknown:
    raise ValueError(f"Unknown remat policies {unknown}; valid:"
                     f" {list(remat.POLICIES)}.")
  rows = []
  for layout in layouts:
    for policy in remat_policies:
      try:
        candidate = dataclasses.replace(
            experiment,
            remat=remat.RematConfig(
                policy=policy, custom=experiment.remat.custom
                if policy == "custom" else ()),
            mesh=mesh_lib.MeshConfig(ici=layout, dcn=experiment.mesh.dcn))
        step = compile_step.compile_train_step(candidate, hardware)
      except compile_step.DoesNotFitError as e:
        rows.append(SweepRow(layout, policy, None, str(e),
                             out_of_memory=True))
        continue
      except ValueError as e:  # The layout does not suit the config.
        rows.append(SweepRow(layout, policy, None, str(e)))
        continue
      rows.append(SweepRow(layout, policy,
                           compile_step.analyse(step, candidate)))
  return rank(rows)


def format_table(rows: Sequence[SweepRow], memory_name: str) -> str:
  """The ranked rows as a text table."""
  header = ("rank", "layout", "remat", "GiB/device", f"% {memory_name}",
            "est. step ms", "fits")
  lines = []
  for rank, row in enumerate(rows, 1):
    report = row.report
    if report is None:
      cells = ("-", "-", "-",
               "no (out of memory)" if row.out_of_memory else
               f"invalid: {row.error}")
    else:
      time = ("n/a" if report.step_time_s is None else
              f"{report.step_time_s * 1e3:.1f}")
      cells = (f"{report.total_bytes / _GIB:.2f}",
               f"{report.total_bytes / report.memory_bytes:.0%}", time,
               "yes" if report.fits else "no")
    lines.append((str(rank), row.layout_text(), row.remat_policy) + cells)
  widths = [max(len(line[i]) for line in [header] + lines)
            for i in range(len(header) - 1)]
  return "\n".join(
      "  ".join(cell.ljust(width) for cell, width in zip(line, widths))
      + "  " + line[-1] for line in [header] + lines) + "\n"
