r"""Training speed of issue #14's standard shapes, MFU against a measured peak.

For each `--shapes` entry (`shapes.SHAPES`; `small`'s global batch is
`--small_batch`), with remat policy `--remat`, prints compile seconds, the
median step time of `--steps` updates after `--warmup_steps`, tokens/s,
model TFLOP/s and MFU per device (MFU against the matmul FLOP/s that
`matmul_peak` measures right before, in the same dtype, for each of
`--dtypes`, or against `--peak_tflops`), and peak memory. Random tokens
(data.source "synthetic"), no checkpoints. Figures only; on a shared
machine run it alternately with whatever it is compared to:

  tools/bazel run //tools/bench:perf_compare -- --shapes=tiny,small \
      --dtypes=float32,bfloat16
"""

from maxtext.common import host_memory

# First: it may re-execute this process under mimalloc, and glibc's
# settings must precede any thread (importing numpy starts one).
_HOST_MALLOC = host_memory.keep_freed_memory(reexec=__name__ == "__main__")

# pylint: disable=wrong-import-position
import dataclasses
import itertools
import statistics
import time

from absl import app
from absl import flags
import jax

from maxtext.kernels import dispatch
from maxtext.trainers import config as config_lib
from maxtext.trainers import hooks
from maxtext.trainers import pretrain
from tools.bench import matmul_peak
from tools.bench import memory
from tools.bench import shapes as shapes_lib

_SHAPES = flags.DEFINE_list(
    "shapes", ["tiny"], f"Shapes to run, of {sorted(shapes_lib.SHAPES)}.")
shapes_lib.validate_shapes_flag("shapes")
_DTYPES = flags.DEFINE_list(
    "dtypes", ["float32"],
    "Activation dtypes, of float32 and bfloat16 (parameters stay float32).")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed updates.", lower_bound=1)
_WARMUP_STEPS = flags.DEFINE_integer("warmup_steps", 2,
                                     "Untimed updates after compilation.",
                                     lower_bound=0)
_PEAK_TFLOPS = flags.DEFINE_float(
    "peak_tflops", 0.0,
    "Peak TFLOP/s per device for MFU, e.g. 989 for an H100/H200 in bf16;"
    " 0 measures it (`matmul_peak`).", lower_bound=0.0)
_SMALL_BATCH = flags.DEFINE_integer("small_batch", 8,
                                    "Global batch of `small`.", lower_bound=1)
_ATTENTION_IMPLS = flags.DEFINE_list(
    "attention_impls", ["auto"],
    f"Attention implementations to run each shape with, of {dispatch.IMPLS}.")
_ATTENTION_BLOCK = flags.DEFINE_integer(
    "attention_block", 512, "Query and key tile of the tiled attentions"
    " (blockwise, splash, pallas_gpu).", lower_bound=16)
_LAYOUT = shapes_lib.LayoutFlags()


def measure(experiment: config_lib.ExperimentConfig, *, steps: int,
            warmup_steps: int) -> tuple[float, float, hooks.Throughput]:
  """(compile seconds, median seconds of `steps` updates after warm-up,
  the run's throughput figures)."""
  prepared = pretrain.prepare(experiment)
  state = prepared.state
  for _ in range(warmup_steps):
    state, _ = prepared.step_fn(state, next(prepared.batches))
  jax.block_until_ready(state)
  seconds = []
  for _ in range(steps):
    batch = next(prepared.batches)
    start = time.perf_counter()
    state, metrics = prepared.step_fn(state, batch)
    jax.block_until_ready((state, metrics))
    seconds.append(time.perf_counter() - start)
  prepared.data.close()
  return (prepared.compile_time_s, statistics.median(seconds),
          prepared.throughput)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  failed = []
  for dtype in _DTYPES.value:
    if _PEAK_TFLOPS.value:
      peak, source = _PEAK_TFLOPS.value * 1e12, "given"
    else:
      peak, source = matmul_peak.matmul_flops_per_s(dtype), "measured"
    print(f"devices {jax.device_count()} x {jax.devices()[0].device_kind};"
          f" {source} {dtype} matmul peak {peak / 1e12:.4f} TFLOP/s/device;"
          f" host malloc {host_memory.malloc_name(_HOST_MALLOC)}")
    for shape, impl in itertools.product(_SHAPES.value,
                                         _ATTENTION_IMPLS.value):
      experiment = shapes_lib.experiment_config(
          shape, dtype, _SMALL_BATCH.value, attention_impl=impl,
          attention_block=_ATTENTION_BLOCK.value, **_LAYOUT.settings())
      try:
        compile_s, step_s, throughput = measure(
            experiment, steps=_STEPS.value,
            warmup_steps=_WARMUP_STEPS.value)
      except Exception as e:  # pylint: disable=broad-exception-caught
        # One row that cannot run (an implementation this backend lacks,
        # memory) leaves the others.
        failed.append(f"{shape} {dtype} attention {impl}")
        print(f"{failed[-1]}: failed: {type(e).__name__}:"
              f" {str(e).splitlines()[0] if str(e) else ''}")
        continue
      figures = dataclasses.replace(
          throughput, peak_flops_per_device=peak).metrics(step_s)
      print(f"{shape} {dtype} attention {impl}: compile {compile_s:.2f} s,"
            " step"
            f" {step_s:.4f} s (median of {_STEPS.value}),"
            f" {figures['perf/tokens_per_s_per_device']:.1f}"
            " tokens/s/device,"
            f" {figures['perf/tflops_per_s_per_device']:.4f} TFLOP/s/device,"
            f" MFU {100 * figures['perf/mfu']:.1f}% of {source} peak, peak"
            f" memory {memory.peak_memory()}")
  if failed:
    raise SystemExit(f"{len(failed)} row(s) failed: {', '.join(failed)}.")

if __name__ == "__main__":
  app.run(main)
