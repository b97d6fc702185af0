"""Multi-process start-up: `jax.distributed.initialize` from flags or a cluster.

Call `initialize` once per process before anything touches the devices. With
an explicit coordinator it starts JAX's distributed runtime; without one it
lets JAX detect a cluster (Slurm, Open MPI, Cloud TPU on GKE, or JAX's own
JAX_COORDINATOR_ADDRESS) from the environment variables in `CLUSTER_ENV_VARS`
and `SLURM_ENV_VARS`; when neither is there the run is single-process and
nothing is initialized. A TPU VM sets its TPU variables on one host too
(TPU_WORKER_HOSTNAMES=localhost): they mean a cluster only when they name
several hosts, so a one-host TPU never starts the runtime (whose TPU
detection asks the GCE metadata server, which a TPU outside GCE lacks). A plain Kubernetes pod is not taken as a cluster (every
pod has KUBERNETES_SERVICE_HOST): pass the flags there.

On CPU, cross-process collectives go through gloo (selected here, before the
runtime starts).
"""

from collections.abc import Mapping
import os

from absl import logging
import jax

# Environment variables whose presence means "a cluster launched this process".
CLUSTER_ENV_VARS = (
    "JAX_COORDINATOR_ADDRESS",  # JAX's own (with JAX_NUM_PROCESSES etc.).
    "OMPI_MCA_orte_hnp_uri",  # Open MPI (mpirun).
    "TPU_WORKER_HOSTNAMES",  # Cloud TPU on GKE.
    "TPU_PROCESS_ADDRESSES",  # Cloud TPU, multi-slice.
)
# Those that mean a cluster only when they list several (comma-separated).
TPU_HOST_LISTS = ("TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES")
# Slurm sets these for every task of a job step (as JAX's detector requires).
SLURM_ENV_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS",
                  "SLURM_PROCID", "SLURM_LOCALID")


def cluster_detected(environ: Mapping[str, str] | None = None) -> bool:
  """Whether `environ` (default: os.environ) shows a multi-process launcher."""
  environ = os.environ if environ is None else environ
  for var in CLUSTER_ENV_VARS:
    if var not in environ:
      continue
    if var not in TPU_HOST_LISTS:
      return True
    if len([h for h in environ[var].split(",") if h.strip()]) > 1:
      return True
  return (all(var in environ for var in SLURM_ENV_VARS) and
          environ["SLURM_NTASKS"].strip() not in ("", "1"))


def check_args(coordinator_address: str | None, num_processes: int | None,
               process_id: int | None, *, cluster: bool) -> bool:
  """Validates the flags; returns whether to initialize the runtime.

  Args:
    coordinator_address: `host:port` of process 0's coordinator, or None.
    num_processes: Processes in the job, or None.
    process_id: This process, in [0, num_processes), or None.
    cluster: Whether a cluster environment can fill in what is None.

  Raises:
    ValueError: the flags are inconsistent; the message names the values.
  """
  given = {name: value for name, value in (
      ("--coordinator_address", coordinator_address),
      ("--num_processes", num_processes),
      ("--process_id", process_id)) if value is not None}
  if num_processes is not None and num_processes < 1:
    raise ValueError(f"--num_processes={num_processes} must be >= 1.")
  if process_id is not None and process_id < 0:
    raise ValueError(f"--process_id={process_id} must be >= 0.")
  if (num_processes is not None and process_id is not None and
      process_id >= num_processes):
    raise ValueError(
        f"--process_id={process_id} must be less than"
        f" --num_processes={num_processes} (ids are 0..{num_processes - 1}).")
  if coordinator_address is not None:
    host, sep, port = coordinator_address.rpartition(":")
    if not (host and sep and port.isdigit()):
      raise ValueError(f"--coordinator_address={coordinator_address!r} must"
                       " be host:port, e.g. 10.0.0.1:1234.")
  if not given:
    return cluster
  if cluster:
    return True  # The cluster fills in what the flags leave out.
  missing = [name for name in ("--coordinator_address", "--num_processes",
                               "--process_id") if name not in given]
  if missing:
    shown = ", ".join(f"{name}={value}" for name, value in given.items())
    raise ValueError(
        f"{shown} given but {', '.join(missing)} missing, and no cluster"
        f" environment ({', '.join(CLUSTER_ENV_VARS)}, Slurm) to fill them"
        " in; give all three flags.")
  return True


def initialize(coordinator_address: str | None = None,
               num_processes: int | None = None,
               process_id: int | None = None) -> bool:
  """Starts JAX's distributed runtime when this is a multi-process run.

  Args:
    coordinator_address: `host:port` of process 0's coordinator, or None.
    num_processes: Processes in the job, or None.
    process_id: This process, in [0, num_processes), or None.

  Returns:
    Whether the runtime was initialized (False: single process).

  Raises:
    ValueError: the flags are inconsistent (the message names the values).
  """
  if not check_args(coordinator_address, num_processes, process_id,
                    cluster=cluster_detected()):
    return False
  # Only the CPU client reads it; harmless on GPU and TPU.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes,
                             process_id=process_id)
  logging.info("Distributed runtime up: process %d of %d (coordinator %s).",
               jax.process_index(), jax.process_count(),
               coordinator_address or "from the environment")
  return True
