r"""Where a train step's time goes: compile phases and the top XLA ops.

For one of issue #14's standard shapes (`shapes.SHAPES`), prints the
seconds of tracing, lowering to StableHLO and XLA compilation of the train
step, then runs `--warmup_steps` updates, records `--steps` more with
`jax.profiler.trace` and prints the `--top` XLA ops by time summed over
those steps: each op's milliseconds per step, its share of all op time, how
often it ran per step, its HLO shape and opcode and the JAX operation it
came from (the op's `op_name` metadata in the compiled HLO), then the
shares of op kinds (names without their number: YNNPACK dot fusions,
transposing copies, collectives, ...). Op times are
summed over threads, so on a multi-core CPU ops that overlap add up to more
than the step's wall time. Figures only; on a shared machine the shares are
more telling than the milliseconds.

  tools/bazel run //tools/bench:profile_step -- --shape=small \
      --dtype=float32 --batch=2 --top=10
  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
  tools/bazel run //tools/bench:profile_step -- --shape=tiny --fsdp
  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
  tools/bazel run //tools/bench:profile_step -- --shape=mixtral-tiny \
      --expert=8
"""

from maxtext.common import host_memory

# First: it may re-execute this process under mimalloc, and glibc's
# settings must precede any thread (importing numpy starts one).
host_memory.keep_freed_memory(reexec=__name__ == "__main__")

# pylint: disable=wrong-import-position
import collections
import glob
import gzip
import json
import os
import re
import tempfile
import time

from absl import app
from absl import flags
import jax

from maxtext.trainers import pretrain
from maxtext.trainers import train_step as train_step_lib
from tools.bench import shapes as shapes_lib

_SHAPE = flags.DEFINE_enum("shape", "small", sorted(shapes_lib.SHAPES),
                           "Standard shape to profile.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                           "Activation dtype (parameters stay float32).")
_BATCH = flags.DEFINE_integer("batch", 2, "Global batch of `small`.",
                              lower_bound=1)
_STEPS = flags.DEFINE_integer("steps", 2, "Profiled updates.", lower_bound=1)
_WARMUP_STEPS = flags.DEFINE_integer("warmup_steps", 1,
                                     "Unprofiled updates after compilation.",
                                     lower_bound=0)
_TOP = flags.DEFINE_integer("top", 10, "Ops to print.", lower_bound=1)
_LAYOUT = shapes_lib.LayoutFlags()

# `%name = f32[2,512]{1,0} opcode(...), ..., metadata={op_name="..." ...}`
# lines of the compiled HLO text.
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT )?%?(?P<name>[\w.\-]+) = (?P<shape>.+?) "
    r"(?P<opcode>[\w\-]+)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CALLS = re.compile(r"calls=%?([\w.\-]+)")


class PhaseTimer:
  """`pretrain.prepare`'s compile function that times trace, lower and
  compile of the train step separately (and keeps the compiled step)."""

  def __init__(self):
    self.seconds = {}
    self.compiled = None

  def __call__(self, experiment, mesh, state, batch_specs):
    del experiment, mesh  # The state carries its shardings.
    start = time.perf_counter()
    traced = train_step_lib.train_step.trace(state, batch_specs)
    self.seconds["trace"] = time.perf_counter() - start
    start = time.perf_counter()
    lowered = traced.lower()
    self.seconds["lower"] = time.perf_counter() - start
    start = time.perf_counter()
    self.compiled = lowered.compile()
    self.seconds["compile"] = time.perf_counter() - start
    return self.compiled


def hlo_instructions(hlo_text: str) -> dict[str, tuple[str, str, str]]:
  """{instruction name: (shape, opcode, JAX op_name)} of compiled HLO text.

  A fusion's own line has no metadata; its op_name is that of the first
  instruction inside its fused computation that has one.
  """
  instructions = {}
  fused_op_names = {}
  computation = None
  for line in hlo_text.splitlines():
    if line and not line[0].isspace() and "{" in line:
      computation = line.split()[0].lstrip("%")
      if computation == "ENTRY":
        computation = line.split()[1].lstrip("%")
      continue
    match = _INSTRUCTION.match(line)
    if match is None:
      continue
    op_name = _OP_NAME.search(line)
    op_name = op_name.group(1) if op_name else ""
    if op_name and computation not in fused_op_names:
      fused_op_names[computation] = op_name
    called = _CALLS.search(line)
    instructions[match.group("name")] = (
        match.group("shape"), match.group("opcode"),
        op_name or (called and called.group(1)) or "")
  return {name: (shape, opcode, fused_op_names.get(op_name, op_name))
          for name, (shape, opcode, op_name) in instructions.items()}


def op_seconds(trace_dir: str) -> tuple[dict[str, float], dict[str, int]]:
  """({XLA op: seconds}, {XLA op: executions}) in the perfetto trace that
  `jax.profiler.trace(trace_dir, create_perfetto_trace=True)` wrote."""
  paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"),
                    recursive=True)
  if not paths:
    raise FileNotFoundError(f"No perfetto trace under {trace_dir}.")
  with gzip.open(max(paths, key=os.path.getmtime)) as f:
    events = json.load(f)["traceEvents"]
  seconds = collections.Counter()
  counts = collections.Counter()
  for event in events:
    op = event.get("args", {}).get("hlo_op")
    if event.get("ph") == "X" and op:
      seconds[op] += event["dur"] / 1e6
      counts[op] += 1
  return seconds, counts


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  experiment = shapes_lib.experiment_config(
      _SHAPE.value, _DTYPE.value, _BATCH.value,
      **_LAYOUT.settings())
  timer = PhaseTimer()
  prepared = pretrain.prepare(experiment, compile_fn=timer)
  print(f"{_SHAPE.value} {_DTYPE.value} batch"
        f" {experiment.train.batch_size}, {jax.device_count()} device(s):"
        " trace"
        f" {timer.seconds['trace']:.2f} s, lower {timer.seconds['lower']:.2f}"
        f" s, XLA compile {timer.seconds['compile']:.2f} s; load average"
        f" {os.getloadavg()[0]:.1f}")
  state = prepared.state
  for _ in range(_WARMUP_STEPS.value):
    state, _ = prepared.step_fn(state, next(prepared.batches))
  jax.block_until_ready(state)
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      start = time.perf_counter()
      for _ in range(_STEPS.value):
        state, metrics = prepared.step_fn(state, next(prepared.batches))
      jax.block_until_ready((state, metrics))
      step_s = (time.perf_counter() - start) / _STEPS.value
    seconds, counts = op_seconds(trace_dir)
  prepared.data.close()
  instructions = hlo_instructions(timer.compiled.as_text())
  total = sum(seconds.values())
  print(f"step {step_s:.3f} s (mean of {_STEPS.value}, profiled); ops"
        f" {total / _STEPS.value:.3f} s per step summed over threads;"
        f" load average {os.getloadavg()[0]:.1f}")
  print(f"{'ms/step':>9} {'share':>6} {'runs':>5}  op  [shape opcode]"
        "  from")
  for op, op_s in seconds.most_common(_TOP.value):
    shape, opcode, op_name = instructions.get(op, ("?", "?", "?"))
    print(f"{1e3 * op_s / _STEPS.value:9.1f} {100 * op_s / total:5.1f}%"
          f" {counts[op] // _STEPS.value:5d}  {op}  [{shape} {opcode}]"
          f"  {op_name}")
  by_kind = collections.Counter()
  for op, op_s in seconds.items():
    by_kind[op.split(".")[0]] += op_s  # "ynn_fusion.12" -> "ynn_fusion"
  print("by kind: " + ", ".join(f"{kind} {100 * op_s / total:.1f}%"
                                for kind, op_s in by_kind.most_common(8)))


if __name__ == "__main__":
  app.run(main)
