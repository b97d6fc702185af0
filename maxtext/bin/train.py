r"""Trains a language model from a config file.

Metrics, TensorBoard events, checkpoints and the resolved config go to
--workdir; running again with the same workdir resumes from its latest
checkpoint (parameters, optimizer and data position).

Example (the small Gemma 3 on Shakespeare, a few minutes on a CPU):

  tools/bazel run //maxtext/bin:train -- --config=configs/gemma3.py \
      --config.train.steps=100 --workdir=runs/gemma3_try

On several hosts, run the same command on each with --coordinator_address
(host:port of process 0), --num_processes and --process_id, or under a cluster
launcher (Slurm, mpirun, Cloud TPU) that sets them in the environment.
"""

import sys

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from maxtext.trainers import config_flag
from maxtext.trainers import distributed
from maxtext.trainers import pretrain
from maxtext.trainers import workdir as workdir_lib

_CONFIG = config_flag.define_config_file(
    "config",
    "Config file and optional variant, e.g. configs/gemma3.py:1b; override"
    " fields with --config.<section>.<key>=<value>.")
_WORKDIR = flags.DEFINE_string(
    "workdir", None,
    "Output directory; default runs/<config file stem>[_<variant>] under the"
    " directory you run from.")
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


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  distributed.initialize(_COORDINATOR_ADDRESS.value, _NUM_PROCESSES.value,
                         _PROCESS_ID.value)
  config_path = config_flags.get_config_filename(flags.FLAGS["config"])
  workdir = (workdir_lib.user_path(_WORKDIR.value) if _WORKDIR.value else
             workdir_lib.default_workdir(config_path))
  logging.info("Process %d of %d; %d local / %d global devices: %s.",
               jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count(),
               jax.devices()[0].device_kind)
  logging.info("Config %s, workdir %s.", config_path, workdir)
  if jax.process_index() != 0:
    logging.set_verbosity(logging.WARNING)  # Process 0 logs the run.
  pretrain.train(_CONFIG.value, workdir)


if __name__ == "__main__":
  flags.mark_flag_as_required("config")
  sys.argv = workdir_lib.resolve_config_argv(sys.argv)
  app.run(main)
