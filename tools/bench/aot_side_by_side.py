r"""Our train step against MaxText's, compiled for TPU topologies from this host.

For each `--rows` entry (`ROWS`: a model, a TPU topology, a mesh, a global
batch, a sequence length and a remat policy, the same in both; bfloat16
activations, float32 weights and AdamW in both), compiles
our train step (`maxtext.aot.compile_step`, what `aot_compile` runs) in
this process and MaxText's (`maxtext.trainers.pre_train.train_compile`, PyPI
`maxtext`, in its own Python 3.12 virtualenv with the libtpu its jax pins;
made on first use as `maxtext_side_by_side.py` makes it) in a subprocess, and prints per
program, per device: argument, output, aliased, temporary and total bytes
against the chip's HBM, the compiler's peak (`peak_memory_in_bytes`), XLA's
FLOPs and bytes accessed, and the count and bytes of each collective kind
(each op's largest result array). `--bisect` also finds, for each row,
the largest global batch (a multiple of the data-parallel devices) whose
step fits in each program: the TPU compiler accepts it and its peak is
within HBM. `--buffers=N` lists each program's N largest temporary buffers
(XLA's memory-usage report of the compile, with the shapes of the values
that share each buffer in turn).

The total (arguments + outputs - aliased + temporaries + code) overstates
what a step holds at once: the TPU compiler reuses donated argument
buffers for temporaries, so its peak is lower (Mixtral 8x7B below: total
67.95 GiB, peak 55.76), and it compiles steps whose total exceeds HBM
(the same row at batch 112: total 115 GiB of 95.7, peak 86.4).

Collectives are counted in the compiled program's text: a scanned layer
stack's body appears once. The two programs use different jax and libtpu
versions (printed). XLA's
cost analysis counts a scanned layer stack's body once: ours extrapolates
from unrolled variants (`compile_step.xla_costs`), MaxText's figures are as
its compiled step reports them (its `scan_layers=true` default), so its
FLOPs and bytes accessed are those of about one layer plus the rest.

Run from the repository root with the dev environment (not under Bazel: it
starts MaxText as a subprocess):

  PYTHONPATH=. python tools/bench/aot_side_by_side.py --rows=llama3_8b
  PYTHONPATH=. python tools/bench/aot_side_by_side.py --rows=llama3_8b \
      --bisect
"""

import ast
import collections
import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile

from absl import app
from absl import flags
import jax

from maxtext.aot import compile_step
from maxtext.aot import topology as topology_lib
from maxtext.trainers.config import ExperimentConfig
from tools.bench import maxtext_side_by_side

_ROWS = flags.DEFINE_list("rows", ["llama3_8b", "mixtral_8x7b", "gemma3_27b"],
                          "Rows of ROWS.")
_BISECT = flags.DEFINE_bool("bisect", False,
                            "Also find each program's largest global batch.")
_SIDES = flags.DEFINE_list("sides", ["ours", "maxtext"], "Programs to run.")
_OURS = flags.DEFINE_list(
    "ours", [], "More settings of our config, as dotted key=value (e.g."
    " model.moe_expert_chunks=4), on every row.")
_F32_ATTENTION = flags.DEFINE_bool(
    "maxtext_float32_attention", True,
    "With --attention=dot_product: MaxText's query-key products and softmax"
    " in float32 (its float32_qk_product and float32_logits), as our"
    " reference kernel computes them; false: its defaults, bfloat16 (half the"
    " memory of each [L, L] score buffer, less precise).")
_BUFFERS = flags.DEFINE_integer(
    "buffers", 0, "Also list each program's this many largest temporary"
    " buffers (XLA's memory-usage report of a dump of the compile, with the"
    " shapes that share each buffer).", lower_bound=0)
_ATTENTION = flags.DEFINE_enum(
    "attention", "flash", ["flash", "dot_product"],
    "flash: each program's TPU default (our splash kernel, MaxText's"
    " autoselected flash); dot_product: plain attention in both (our"
    " reference kernel, MaxText's dot_product; float32 scores in both unless"
    " --nomaxtext_float32_attention), no Pallas (MaxText's experts through"
    " ragged_dot, as ours on more than one device).")

_GIB = 2**30
# XLA's memory-usage report: one line per buffer of the temporaries,
# "cumulative (share%); size; offset; values; shapes".
_REPORT_LINE_RE = re.compile(
    r"^\s*[\d.]+[KMG]?i?B\(\s*\d+%\);\s*([\d.]+)([KMG]?i?B);\s*\d+;\s*\d+;"
    r"\s*(.+)$")
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
_DUMP_MODULE = "jit_train_step"
# A collective op (an async "-start" half counted once) and its result
# type: an array, or a tuple of them for the async ops.
_OP_RE = re.compile(r"=\s*(.+?)\s(" + "|".join(compile_step.COLLECTIVES) +
                    r")(?:-start)?\(")
_SHAPE_RE = re.compile(r"\b(pred|[a-z]+\d+(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
                "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4,
                "u32": 4, "f64": 8, "s64": 8, "u64": 8}


@dataclasses.dataclass(frozen=True)
class Row:
  """One model, topology and shape, in both programs' terms."""
  topology: str
  # Ours: configs/<file>.py variant and dotted overrides.
  config: str
  ours: dict
  # MaxText: model_name and other base.yml overrides.
  maxtext: dict
  batch: int
  seq_len: int
  remat: str = "full"


ROWS = {
    "llama3_8b": Row(
        topology="v5p-8", config="llama3:8b", batch=8, seq_len=8192,
        ours={"mesh.ici.data": 1, "mesh.ici.fsdp": -1},
        maxtext={"model_name": "llama3-8b", "ici_fsdp_parallelism": -1}),
    "mixtral_8x7b": Row(
        topology="v5p-32", config="mixtral:8x7b", batch=16, seq_len=4096,
        ours={"mesh.ici.data": 1, "mesh.ici.fsdp": -1, "mesh.ici.expert": 8},
        maxtext={"model_name": "mixtral-8x7b", "ici_fsdp_parallelism": -1,
                 "ici_expert_parallelism": 8}),
    # Fits in neither program (tools/bench/README.md): float32 weights and
    # AdamW alone take 20.3 GiB of v6e's 31.25 per device.
    "gemma3_27b": Row(
        topology="v6e-16", config="gemma3:27b", batch=16, seq_len=4096,
        ours={"mesh.ici.data": 1, "mesh.ici.fsdp": -1},
        maxtext={"model_name": "gemma3-27b", "ici_fsdp_parallelism": -1}),
}


def collective_stats(hlo_text: str) -> dict[str, tuple[int, int]]:
  """{kind: (count, bytes)} of the collectives in HLO text; an op's bytes
  are its largest result array (an async op's result tuple holds its
  operand and its output buffer)."""
  stats = collections.defaultdict(lambda: [0, 0])
  for result, kind in _OP_RE.findall(hlo_text):
    sizes = [0]
    for dtype, dims in _SHAPE_RE.findall(result):
      size = _DTYPE_BYTES.get(dtype, 4)
      for d in filter(None, dims.split(",")):
        size *= int(d)
      sizes.append(size)
    stats[kind][0] += 1
    stats[kind][1] += max(sizes)
  return {kind: tuple(stats[kind]) for kind in compile_step.COLLECTIVES
          if kind in stats}


def largest_buffers(folder: str, count: int) -> list[tuple[int, str]]:
  """The `count` largest buffers [(bytes, shapes)] of the temporaries of the
  train step XLA dumped into `folder` (its memory-usage report's first
  section, largest first)."""
  reports = [name for name in os.listdir(folder)
             if _DUMP_MODULE in name and
             name.endswith("memory-usage-report.txt")]
  if len(reports) != 1:
    raise RuntimeError(f"Expected one memory-usage report of {_DUMP_MODULE}"
                       f" in {folder}, found {reports}.")
  buffers = []
  with open(os.path.join(folder, reports[0]), encoding="utf-8") as f:
    for line in f:
      if buffers and not line.strip():
        break  # The end of the first section.
      match = _REPORT_LINE_RE.match(line)
      if match:
        size, unit, shapes = match.groups()
        buffers.append((int(float(size) * _UNITS[unit]), shapes.strip()))
  return sorted(buffers, key=lambda b: -b[0])[:count]


def _dump_options(folder: str) -> dict:
  return {"xla_dump_to": folder, "xla_dump_hlo_as_text": True,
          "xla_dump_hlo_module_re": _DUMP_MODULE}


def _figures(memory, cost: dict, hlo_text: str, hbm: int) -> dict:
  total = (memory["argument"] + memory["output"] - memory["alias"] +
           memory["temp"] + memory["code"])
  return dict(memory, total=total, hbm=hbm,
              flops=float(cost.get("flops", 0.0)),
              bytes_accessed=float(cost.get("bytes accessed", 0.0)),
              collectives=collective_stats(hlo_text))


def _memory_dict(stats) -> dict[str, int]:
  return dict(argument=stats.argument_size_in_bytes,
              output=stats.output_size_in_bytes,
              alias=stats.alias_size_in_bytes,
              temp=stats.temp_size_in_bytes,
              code=stats.generated_code_size_in_bytes,
              peak=stats.peak_memory_in_bytes)


# Runs in MaxText's virtualenv: compiles with train_compile.main and writes
# the compiled step's memory, cost analysis and HLO text.
_MAXTEXT_WRAPPER = r"""
import json, sys
import jax
from maxtext.trainers.pre_train import train_compile
out = sys.argv[1]
captured = []
compile_fn = train_compile.jit_and_compile
def capture(*args, **kwargs):
  captured.append(compile_fn(*args, **kwargs))
  return captured[-1]
train_compile.jit_and_compile = capture
try:
  train_compile.main([sys.argv[0], *sys.argv[2:]])
except Exception as e:
  if "RESOURCE_EXHAUSTED" not in str(e):
    raise
  json.dump({"oom": str(e).splitlines()[0]}, open(out + ".json", "w"))
  sys.exit(0)
compiled = captured[-1]
m = compiled.memory_analysis()
cost = compiled.cost_analysis() or {}
cost = cost[0] if isinstance(cost, list) else cost
json.dump({"memory": dict(
    argument=m.argument_size_in_bytes, output=m.output_size_in_bytes,
    alias=m.alias_size_in_bytes, temp=m.temp_size_in_bytes,
    code=m.generated_code_size_in_bytes, peak=m.peak_memory_in_bytes),
    "cost": {k: float(v) for k, v in cost.items()
             if k in ("flops", "bytes accessed")},
    "versions": f"jax {jax.__version__}, libtpu "
                + __import__("importlib.metadata").metadata.version("libtpu")},
    open(out + ".json", "w"))
open(out + ".hlo", "w").write(compiled.as_text())
"""


def _plain_f32() -> bool:
  return _ATTENTION.value == "dot_product" and _F32_ATTENTION.value


def run_maxtext(row: Row, batch: int, devices: int, hbm: int,
                dump: str | None = None) -> dict:
  """MaxText's figures for `row` at global `batch` ({"oom": why} when its
  compiler runs out of HBM); with `dump`, XLA dumps the compile there."""
  python = maxtext_side_by_side.ensure_venv()
  base = maxtext_side_by_side.base_yml(python)
  overrides = {
      **row.maxtext, "compile_topology": row.topology,
      "compile_topology_num_slices": 1, "max_target_length": row.seq_len,
      "per_device_batch_size": batch / devices,
      "remat_policy": row.remat, "dtype": "bfloat16",
      "attention": ("dot_product" if _ATTENTION.value == "dot_product"
                    else "autoselected"),
      "float32_qk_product": _plain_f32(), "float32_logits": _plain_f32(),
      # dot_product: no Pallas, so experts through ragged_dot, not megablox.
      "megablox": _ATTENTION.value != "dot_product",
      "weight_dtype": "float32", "dataset_type": "synthetic",
      "enable_checkpointing": False, "skip_jax_distributed_system": True,
      "run_name": "aot_side_by_side"}
  with tempfile.TemporaryDirectory() as folder:
    out = os.path.join(folder, "step")
    overrides["base_output_directory"] = folder
    result = subprocess.run(
        [python, "-c", _MAXTEXT_WRAPPER, out, base,
         *(f"{k}={v}" for k, v in overrides.items())],
        env={**os.environ, "DECOUPLE_GCLOUD": "TRUE", "PYTHONPATH": "",
             **({"XLA_FLAGS": " ".join(
                 [os.environ.get("XLA_FLAGS", "")] +
                 [f"--{k}={str(v).lower()}"
                  for k, v in _dump_options(dump).items()])}
                if dump else {})},
        capture_output=True, text=True, cwd=folder)
    if result.returncode:
      raise RuntimeError(f"MaxText's train_compile failed:\n"
                         f"{(result.stdout + result.stderr)[-3000:]}")
    with open(out + ".json", encoding="utf-8") as f:
      got = json.load(f)
    if "oom" in got:
      return got
    with open(out + ".hlo", encoding="utf-8") as f:
      hlo = f.read()
  figures = _figures(got["memory"], got["cost"], hlo, hbm)
  figures["versions"] = got["versions"]
  return figures


def run_ours(row: Row, batch: int, hardware, costs: bool = True,
             dump: str | None = None) -> dict:
  """Our figures for `row` at global `batch` ({"oom": why} when the
  compiler runs out of HBM); without `costs`, no FLOPs and bytes accessed
  (they compile unrolled variants); with `dump`, XLA dumps the compile
  there."""
  module, variant = row.config.split(":")
  config = importlib.import_module(f"configs.{module}").get_config(variant)
  settings = {**row.ours, "model.dtype": "bfloat16",
              "model.param_dtype": "float32", "data.seq_len": row.seq_len,
              "train.batch_size": batch, "remat.policy": row.remat,
              "data.source": "synthetic",
              "attention_kernel.impl": ("reference"
                                        if _ATTENTION.value == "dot_product"
                                        else "auto")}
  for setting in _OURS.value:
    key, _, value = setting.partition("=")
    try:
      settings[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      settings[key] = value  # A string.
  try:
    config.update_from_flattened_dict(settings)
    experiment = ExperimentConfig.from_config_dict(config)
  except (KeyError, TypeError, ValueError) as e:
    raise app.UsageError(f"--ours={','.join(_OURS.value)}: {e}") from e
  try:
    step = compile_step.compile_train_step(
        experiment, hardware, _dump_options(dump) if dump else None)
  except compile_step.DoesNotFitError as e:
    return {"oom": str(e)}
  xla = compile_step.xla_costs(step, experiment)[0] if costs else {}
  figures = _figures(_memory_dict(step.compiled.memory_analysis()), xla,
                     step.compiled.as_text(), hardware.memory_bytes)
  figures["versions"] = f"jax {jax.__version__}"
  return figures


def _fits(figures: dict) -> bool:
  return "oom" not in figures and figures["peak"] <= figures["hbm"]


def _bisect(run, step: int) -> int:
  """Largest multiple of `step` whose `run(batch)` fits (0: not even
  `step`), doubling then bisecting."""
  if not _fits(run(step)):
    return 0
  good, bad = step, None
  while bad is None:
    trial = good * 2
    if _fits(run(trial)):
      good = trial
    else:
      bad = trial
  while bad - good > step:
    middle = (good + bad) // 2 // step * step
    if _fits(run(middle)):
      good = middle
    else:
      bad = middle
  return good


def _print(name: str, side: str, f: dict) -> None:
  if "oom" in f:
    print(f"{name} {side}: does not fit: {f['oom']}")
    return
  gib = {k: f[k] / _GIB for k in ("argument", "output", "alias", "temp",
                                  "code", "total", "peak", "hbm")}
  collectives = ", ".join(f"{k} x{n} ({b / _GIB:.2f} GiB)"
                          for k, (n, b) in f["collectives"].items())
  print(f"| {name} | {side} | {gib['argument']:.2f} | {gib['output']:.2f} |"
        f" {gib['alias']:.2f} | {gib['temp']:.2f} | {gib['total']:.2f} /"
        f" {gib['hbm']:.1f} | {gib['peak']:.2f} | {f['flops']:.3e} |"
        f" {f['bytes_accessed']:.3e} |"
        f" {collectives} |", flush=True)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  unknown = [r for r in _ROWS.value if r not in ROWS]
  if unknown:
    raise app.UsageError(f"--rows holds {unknown}; valid: {sorted(ROWS)}.")
  print("| row | program | arguments GiB | outputs | aliased | temporaries |"
        " total / HBM | peak | XLA FLOPs | bytes accessed | collectives"
        " (count, result bytes) |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  configured = False
  versions = {}
  for name in _ROWS.value:
    row = ROWS[name]
    target = topology_lib.parse_topology(row.topology)
    if not configured:
      topology_lib.configure_backend(target)
      configured = True
    hardware = topology_lib.make_devices(target)
    devices = len(hardware.devices)
    runs = {"ours": lambda b, r=row, h=hardware, **kw: run_ours(r, b, h,
                                                                **kw),
            "maxtext": lambda b, r=row, d=devices, h=hardware, **kw:
                       run_maxtext(r, b, d, h.memory_bytes, **kw)}
    for side in _SIDES.value:
      with tempfile.TemporaryDirectory() as dump:
        figures = runs[side](row.batch,
                             dump=dump if _BUFFERS.value else None)
        # The compiler writes the report also when the step does not fit.
        buffers = (largest_buffers(dump, _BUFFERS.value)
                   if _BUFFERS.value else [])
      versions[side] = figures.get("versions", versions.get(side))
      _print(name, side, figures)
      for size, shapes in buffers:
        print(f"  {name} {side} buffer: {size / _GIB:.2f} GiB: {shapes}",
              flush=True)
    if _BISECT.value:
      for side in _SIDES.value:
        fit = runs[side] if side == "maxtext" else (
            lambda b, r=row, h=hardware: run_ours(r, b, h, costs=False))
        largest = _bisect(fit, devices)
        print(f"{name} {side}: largest global batch that fits: {largest}",
              flush=True)
  print(f"Versions: {versions}; {sys.version.split()[0]} here.")


if __name__ == "__main__":
  app.run(main)
