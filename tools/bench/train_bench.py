r"""Measures the training speed of a config; prints figures, asserts nothing.

Prints compile seconds, step time, tokens/s, TFLOP/s and MFU per device, and
peak memory (device memory stats where the backend has them, else the host
process's peak RSS). By default the batches are random tokens (data.source
"synthetic") so that reading and tokenizing text is not measured.

Example:

  tools/bazel run //tools/bench:train_bench -- --config=configs/gemma3.py \
      --steps=10 --config.train.batch_size=16

Mixture of experts, dropless vs capacity with expert parallelism on 8 fake
CPU devices: run it alternately (other jobs share the cores) with

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \
  tools/bazel run //tools/bench:train_bench -- --config=configs/mixtral.py \
      --config.mesh.ici.data=1 --config.mesh.ici.expert=8 \
      --config.model.moe_impl=dropless   # then =capacity, and again.
"""

from maxtext.common import host_memory
from maxtext.common import paths

# First: it may re-execute this process under mimalloc, and glibc's
# settings must precede any thread (importing numpy starts one).
host_memory.keep_freed_memory(reexec=__name__ == "__main__")

# pylint: disable=wrong-import-position
import sys
import time

from absl import app
from absl import flags
import jax
from ml_collections import config_flags

from maxtext.common import config_flag
from maxtext.trainers import pretrain
from maxtext.trainers.config import ExperimentConfig
from tools.bench import memory

_CONFIG = config_flag.define_config_file(
    "config", "Config file and optional variant, e.g. configs/gemma3.py.")
_STEPS = flags.DEFINE_integer("steps", 10, "Timed updates.", lower_bound=1)
_WARMUP_STEPS = flags.DEFINE_integer(
    "warmup_steps", 2, "Untimed updates run first (after compilation).",
    lower_bound=0)
_SYNTHETIC = flags.DEFINE_bool(
    "synthetic", True, "Use random tokens instead of the config's data.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  if _SYNTHETIC.value:
    config.data.source = "synthetic"
  experiment = ExperimentConfig.from_config_dict(config)
  prepared = pretrain.prepare(experiment)
  state = prepared.state
  for _ in range(_WARMUP_STEPS.value):
    state, metrics = prepared.step_fn(state, next(prepared.batches))
  jax.block_until_ready(state)
  start = time.perf_counter()
  for _ in range(_STEPS.value):
    state, metrics = prepared.step_fn(state, next(prepared.batches))
  jax.block_until_ready((state, metrics))
  step_time = (time.perf_counter() - start) / _STEPS.value
  figures = prepared.throughput.metrics(step_time)
  mfu = figures["perf/mfu"]
  rows = [
      ("config", config_flags.get_config_filename(flags.FLAGS["config"])),
      ("devices", f"{jax.device_count()} x {jax.devices()[0].device_kind}"),
      ("batch x length", f"{experiment.train.batch_size} x"
                         f" {experiment.data.seq_len}"),
      ("compile s", f"{prepared.compile_time_s:.2f}"),
      ("step time s", f"{step_time:.4f}"),
      ("tokens/s/device", f"{figures['perf/tokens_per_s_per_device']:.1f}"),
      ("TFLOP/s/device", f"{figures['perf/tflops_per_s_per_device']:.3f}"),
      ("MFU", "n/a (unknown peak)" if mfu is None else f"{100 * mfu:.1f}%"),
      ("peak memory", memory.peak_memory()),
      ("last loss", f"{float(metrics['train/loss']):.4f}"),
  ]
  # Mixture of experts: the drops and balance behind the speed.
  rows += [(name, f"{float(metrics[name]):.4f}") for name in
           ("moe/dropped_fraction", "moe/load_imbalance") if name in metrics]
  width = max(len(name) for name, _ in rows)
  for name, value in rows:
    print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  sys.argv = paths.resolve_config_argv(sys.argv)
  app.run(main)
