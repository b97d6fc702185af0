"""The train binary as a child process, for fault-injection and elastic tests.

`TrainProcess` starts `python -m maxtext.bin.train` on a tiny Gemma 3 config
(`TINY_OVERRIDES`, synthetic tokens) with its own fake CPU device count, logs
its output to a file, reports the updates it has logged, and can be signalled
(SIGKILL, SIGTERM) like a scheduler would.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time

from maxtext.metrics import writers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "gemma3.py") + ":small"
# A model that compiles and trains in seconds on one CPU core.
TINY_OVERRIDES = {
    "model.vocab_size": 256, "model.num_layers": 1, "model.embed_dim": 64,
    "model.mlp_dim": 128, "model.num_heads": 2, "model.num_kv_heads": 1,
    "model.head_dim": 32, "model.query_pre_attn_scalar": 32.0,
    "model.sliding_window": 8, "data.source": "synthetic",
    "data.seq_len": 16, "train.batch_size": 8,
    "optimizer.learning_rate": 1e-2, "optimizer.warmup_steps": 1,
    "logging.every_steps": 1, "logging.tensorboard": False,
}
# Launcher variables a child must not inherit (it would join another job).
_CLUSTER_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
                 "JAX_PROCESS_ID", "OMPI_MCA_orte_hnp_uri",
                 "TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES",
                 "SLURM_JOB_ID")
# The metrics log line of an update: "step 12 | train/loss=...".
_STEP_LINE = re.compile(r"\] step (\d+) \| ")
# pretrain's line after a restore.
_RESTORED_LINE = re.compile(r"Restored (\S+): resuming after update (\d+)\.")


def child_env(num_devices: int) -> dict[str, str]:
  """The environment of a child with `num_devices` fake CPU devices."""
  env = {k: v for k, v in os.environ.items() if k not in _CLUSTER_VARS}
  # The device count, not XLA_FLAGS: the test's own XLA flags (.bazelrc's
  # compile settings) stay.
  env["JAX_NUM_CPU_DEVICES"] = str(num_devices)
  env["JAX_PLATFORMS"] = "cpu"
  # Under Bazel the stub's PYTHONPATH is inherited; outside, the repo root.
  env["PYTHONPATH"] = os.pathsep.join(
      p for p in (ROOT, env.get("PYTHONPATH")) if p)
  return env


def cache_env(num_devices: int = 1) -> dict[str, str]:
  """`child_env` for a child whose persistent compilation cache is the one
  its flags choose (not Bazel's, shared by the tests) and that logs when it
  loads a program from it (`cache_hit`)."""
  env = child_env(num_devices)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  env["JAX_LOG_COMPILES"] = "1"  # JAX then logs cache hits as warnings.
  return env


def cache_hit(program: str) -> str:
  """The line a `cache_env` child logs when it loads `program` (e.g.
  "jit_train_step") from the persistent compilation cache."""
  return f"Persistent compilation cache hit for '{program}'"


def cached(cache_dir: str, program: str) -> bool:
  """Whether the persistent compilation cache in `cache_dir` holds
  `program`."""
  return any(name.startswith(program) for name in os.listdir(cache_dir))


def free_port() -> int:
  """A free TCP port on 127.0.0.1 (for a coordinator)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def module_argv(module: str) -> list[str]:
  """The command line running `module` (e.g. "maxtext.bin.sft") with the
  interpreter as this test was started (Bazel's adds -S -P)."""
  return ([sys.executable] + (["-S"] if sys.flags.no_site else []) +
          (["-P"] if sys.flags.safe_path else []) + ["-m", module])


def train_argv(workdir: str, overrides: dict[str, object],
               flags: dict[str, object] | None = None) -> list[str]:
  """The command line training `CONFIG` with `TINY_OVERRIDES` + overrides,
  and other flags of the binary."""
  argv = module_argv("maxtext.bin.train") + [f"--config={CONFIG}",
                                             f"--workdir={workdir}"]
  argv += [f"--config.{k}={v}"
           for k, v in {**TINY_OVERRIDES, **overrides}.items()]
  return argv + [f"--{k}={v}" for k, v in (flags or {}).items()]


def losses(workdir: str) -> dict[int, dict[str, float | None]]:
  """Metrics of `workdir/metrics.jsonl` by step (a rerun step's last line)."""
  return writers.read_jsonl(os.path.join(workdir, writers.JSONL_FILENAME))


class TrainProcess:
  """One run of the train binary, output in `log_path`."""

  def __init__(self, workdir: str, overrides: dict[str, object], *,
               log_path: str, num_devices: int = 1,
               flags: dict[str, object] | None = None):
    self.workdir = workdir
    self.log_path = log_path
    self._log = open(log_path, "w", encoding="utf-8")
    self.process = subprocess.Popen(
        train_argv(workdir, overrides, flags), env=child_env(num_devices),
        cwd=ROOT,
        stdout=self._log, stderr=subprocess.STDOUT)

  def log(self) -> str:
    with open(self.log_path, encoding="utf-8", errors="replace") as f:
      return f.read()

  def logged_step(self) -> int:
    """The newest update whose metrics the run logged (0: none yet)."""
    return max((int(m) for m in _STEP_LINE.findall(self.log())), default=0)

  def restored(self) -> tuple[str, int] | None:
    """(path, step) of the checkpoint the run resumed from, if any."""
    match = _RESTORED_LINE.search(self.log())
    return (match.group(1), int(match.group(2))) if match else None

  def running(self) -> bool:
    return self.process.poll() is None

  def wait_until(self, condition, timeout_s: float, poll_s: float = 0.001
                 ) -> bool:
    """Polls `condition()` until true (True) or the run ends (False).

    Raises:
      TimeoutError: neither within `timeout_s`.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
      if condition():
        return True
      if not self.running():
        return bool(condition())
      time.sleep(poll_s)
    self.kill()
    raise TimeoutError(f"Run still going after {timeout_s} s:\n"
                       f"{self.tail()}")

  def signal(self, signum: int) -> None:
    self.process.send_signal(signum)

  def kill(self) -> None:
    if self.running():
      self.process.send_signal(signal.SIGKILL)
    self.finish(timeout_s=60)

  def finish(self, timeout_s: float) -> int:
    """Waits for the run to end; returns its exit status.

    Raises:
      TimeoutError: it had not ended after `timeout_s` (it is killed); the
        message ends with the log's tail.
    """
    try:
      return self.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
      raise TimeoutError(f"Run still going after {timeout_s} s, killed:\n"
                         f"{self.tail()}") from e
    finally:
      if self.process.poll() is None:
        self.process.kill()
        self.process.wait()
      self._log.close()

  def tail(self, lines: int = 40) -> str:
    return "".join(self.log().splitlines(keepends=True)[-lines:])
