r"""Trains a language model from a config file.

Metrics, TensorBoard events, checkpoints and the resolved config go to
--workdir; running again with the same workdir resumes from its newest usable
checkpoint (parameters, optimizer and data position). Compiled programs go to
JAX's persistent compilation cache (--compilation_cache_dir, by default in the
workdir), so a rerun of the same config loads them instead of compiling.

Example (the small Gemma 3 on Shakespeare, a few minutes on a CPU):

  tools/bazel run //maxtext/bin:train -- --config=configs/gemma3.py \
      --config.train.steps=100 --workdir=runs/gemma3_try

On several hosts, run the same command on each with --coordinator_address
(host:port of process 0), --num_processes and --process_id, or under a cluster
launcher (Slurm, mpirun, Cloud TPU) that sets them in the environment.

Faults. Checkpoints carry a checksum manifest; a corrupt one is reported
(step and path) and the next older one used. With --config.checkpoint.local_dir
(a folder in the workdir, or a symlink there to a RAM disk or local SSD) and
--config.checkpoint.local_every_steps, a fast local tier bounds what a killed
process (SIGKILL) costs to the updates since its last local save (a lost
machine: since the last persistent one); the run resumes from the newest
usable checkpoint of either tier. It may resume on another device count or
mesh, as long as the batch divides over it. One run at a time per workdir:
a second one exits at once naming the first's pid and host (the lock dies
with its process, however it ends).

Exit status:
  0   trained to train.steps.
  1   an error: one line on stderr names what is wrong (a config key or value,
      a path, a checkpoint's step and path, the step of a NaN); rerun with
      --verbosity=1 for the traceback. Nothing written before is lost.
  75  preempted: SIGTERM or Ctrl-C arrived, the run saved a checkpoint at the
      next step boundary and stopped ("Preempted after update N ..."); run
      the same command again to resume.
  130 a second Ctrl-C (or, with several processes, the first: JAX's
      preemption service catches SIGTERM only) stopped the run at once; the
      checkpoints saved before it are kept.
"""

from maxtext.common import host_memory

# First: it may re-execute this process under mimalloc, and glibc's
# settings must precede any thread (importing numpy starts one).
_HOST_MALLOC = host_memory.keep_freed_memory(reexec=__name__ == "__main__")

# pylint: disable=wrong-import-position
import functools
import sys

from absl import app
from absl import flags
from absl import logging
import jax
import ml_collections
from ml_collections import config_flags

from maxtext.aot import saved_step
from maxtext.checkpoint import manager as checkpoint_lib
from maxtext.common import cli
from maxtext.common import compilation_cache
from maxtext.common import config_flag
from maxtext.common import paths
from maxtext.common import workdir as workdir_lib
from maxtext.trainers import distributed
from maxtext.trainers import loop
from maxtext.trainers import preemption
from maxtext.trainers import pretrain

_CONFIG = config_flag.define_config_file(
    "config",
    "Config file and optional variant, e.g. configs/gemma3.py:1b; override"
    " fields with --config.<section>.<key>=<value>.")
_WORKDIR = flags.DEFINE_string(
    "workdir", None,
    "Output directory; default runs/<config file stem>[_<variant>] under the"
    " directory you run from.")
_COMPILED = flags.DEFINE_string(
    "compiled", None,
    "A train step compiled ahead of time by `aot_compile --save` for this"
    " config and topology; refused, naming the differences, if it was"
    " compiled for another.")
_COMPILATION_CACHE_DIR = compilation_cache.define_flag()
_COORDINATOR_ADDRESS = flags.DEFINE_string(
    "coordinator_address", None,
    "Multi-process runs: host:port of process 0's coordinator (the same on"
    " every process). Unset with no cluster environment: one process.")
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "Multi-process runs: number of processes.")
_PROCESS_ID = flags.DEFINE_integer(
    "process_id", None,
    "Multi-process runs: this process, 0..num_processes-1; process 0 writes"
    " the logs, metrics and config.")


# Errors of bad input or a bad environment: reported in one line, exit 1.
EXPECTED_ERRORS = cli.EXPECTED_ERRORS + (checkpoint_lib.CheckpointError,
                                         loop.NonFiniteError)


def errors_in_one_line():
  """`cli.errors_in_one_line` for train's `EXPECTED_ERRORS`."""
  return cli.errors_in_one_line("train", EXPECTED_ERRORS)


def run(config: ml_collections.ConfigDict, workdir: str,
        compiled: str | None = None) -> None:
  """Trains `config` in `workdir` with the exits of the module docstring,
  with the train step saved in `compiled` if given.

  Raises:
    SystemExit: on bad input (one line, status 1) or after a preemption
      (status `EXIT_CODE_PREEMPTED`).
  """
  compile_fn = (functools.partial(saved_step.load_compiled, compiled)
                if compiled else None)
  with errors_in_one_line():
    result = pretrain.train(config, workdir, compile_fn=compile_fn)
  if result.preempted:
    logging.warning("Preempted after update %d; its checkpoint is in %s. Run"
                    " the same command to resume.", result.step, workdir)
    raise SystemExit(preemption.EXIT_CODE_PREEMPTED)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  with errors_in_one_line():
    distributed.initialize(_COORDINATOR_ADDRESS.value, _NUM_PROCESSES.value,
                           _PROCESS_ID.value)
  config_path = config_flags.get_config_filename(flags.FLAGS["config"])
  workdir = workdir_lib.resolve_workdir(_WORKDIR.value, config_path)
  logging.info("Process %d of %d; %d local / %d global devices: %s; host"
               " malloc %s.", jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count(),
               jax.devices()[0].device_kind,
               host_memory.malloc_name(_HOST_MALLOC))
  cache = compilation_cache.use(_COMPILATION_CACHE_DIR.value, workdir)
  logging.info("Config %s, workdir %s, compilation cache %s.", config_path,
               workdir, cache or "off")
  if jax.process_index() != 0:
    logging.set_verbosity(logging.WARNING)  # Process 0 logs the run.
  run(_CONFIG.value, workdir,
      paths.user_path(_COMPILED.value) if _COMPILED.value else None)


def console_main() -> None:
  """Starts the binary: under `bazel run`, and as the pip install's
  `maxtext-train`."""
  flags.mark_flag_as_required("config")
  sys.argv = paths.resolve_config_argv(sys.argv)
  app.run(main)


if __name__ == "__main__":
  console_main()
