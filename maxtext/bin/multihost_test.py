"""Two processes == one: the train binary over jax.distributed on CPU.

Runs `python -m maxtext.bin.train` as child processes of a tiny Gemma 3 on
synthetic tokens:
  * one process with 8 fake CPU devices (the reference),
  * two processes on 127.0.0.1 with 4 fake CPU devices each (gloo
    collectives), the same 8-device data-parallel mesh,
and checks that their per-step losses (metrics.jsonl, written by process 0
only) agree to `_RTOL`. Then a single process restores the two-process
checkpoint of step 2 on a different mesh (fsdp instead of data) and its
steps 3 and 4 match the reference.

Each child sets its own XLA_FLAGS; children are killed when a sibling fails
or `_TIMEOUT_S` passes.
"""

import os
import shutil
import socket
import subprocess
import sys
import time

from absl import logging
from absl.testing import absltest

from maxtext.metrics import writers

# fp32 throughout; the cross-process all-reduce (gloo) may sum the gradient
# shards in another order than the in-process one.
_RTOL = 1e-5
_TIMEOUT_S = 90
_STEPS = 4
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_CONFIG = os.path.join(_ROOT, "configs", "gemma3.py") + ":small"
_OVERRIDES = {
    "model.vocab_size": 256, "model.num_layers": 1, "model.embed_dim": 64,
    "model.mlp_dim": 128, "model.num_heads": 2, "model.num_kv_heads": 1,
    "model.head_dim": 32, "model.query_pre_attn_scalar": 32.0,
    "model.sliding_window": 8, "data.source": "synthetic",
    "data.seq_len": 16, "train.batch_size": 8, "train.steps": _STEPS,
    "optimizer.learning_rate": 1e-2, "optimizer.warmup_steps": 1,
    "checkpoint.every_steps": 2,
    "logging.every_steps": 1, "logging.tensorboard": False,
}
_DATA_MESH = {"mesh.ici.data": -1, "mesh.ici.fsdp": 1}
_FSDP_MESH = {"mesh.ici.data": 1, "mesh.ici.fsdp": -1}
# Launcher variables a child must not inherit (it would join another job).
_CLUSTER_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
                 "JAX_PROCESS_ID", "OMPI_MCA_orte_hnp_uri",
                 "TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES",
                 "SLURM_JOB_ID")


def _free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _child_env(num_devices: int) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if k not in _CLUSTER_VARS}
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices}"
  env["JAX_PLATFORMS"] = "cpu"
  # Under Bazel the stub's PYTHONPATH is inherited; outside, the repo root.
  env["PYTHONPATH"] = os.pathsep.join(
      p for p in (_ROOT, env.get("PYTHONPATH")) if p)
  return env


def _argv(workdir: str, mesh: dict[str, int], **flags) -> list[str]:
  # The interpreter as this test was started (Bazel's adds -S -P).
  interpreter = ([sys.executable] + (["-S"] if sys.flags.no_site else []) +
                 (["-P"] if sys.flags.safe_path else []))
  argv = interpreter + ["-m", "maxtext.bin.train", f"--config={_CONFIG}",
                        f"--workdir={workdir}"]
  argv += [f"--config.{k}={v}" for k, v in {**_OVERRIDES, **mesh}.items()]
  argv += [f"--{k}={v}" for k, v in flags.items()]
  return argv


def _tail(path: str, lines: int = 30) -> str:
  with open(path, encoding="utf-8", errors="replace") as f:
    return "".join(f.readlines()[-lines:])


class MultihostTest(absltest.TestCase):

  def _run(self, commands: list[tuple[list[str], dict[str, str]]]) -> None:
    """Runs the commands at once; fails (killing the rest) if one fails."""
    logdir = self.create_tempdir().full_path
    procs = []
    try:
      for i, (argv, env) in enumerate(commands):
        log = open(os.path.join(logdir, f"child{i}.log"), "w")
        procs.append((subprocess.Popen(argv, env=env, cwd=_ROOT, stdout=log,
                                       stderr=subprocess.STDOUT), log))
      deadline = time.monotonic() + _TIMEOUT_S
      while any(p.poll() is None for p, _ in procs):
        failed = [i for i, (p, _) in enumerate(procs)
                  if p.returncode not in (None, 0)]
        if failed or time.monotonic() > deadline:
          break
        time.sleep(0.2)
    finally:
      for p, log in procs:
        if p.poll() is None:
          p.kill()
        p.wait()
        log.close()
    for i, (p, _) in enumerate(procs):
      if p.returncode != 0:
        self.fail(f"child {i} exited with {p.returncode} (-9: killed after a"
                  f" sibling failed or {_TIMEOUT_S} s):\n"
                  f"{_tail(os.path.join(logdir, f'child{i}.log'))}")

  def _losses(self, workdir: str) -> dict[int, float]:
    metrics = writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    return {step: m["train/loss"] for step, m in metrics.items()}

  def test_two_processes_equal_one_and_restore_on_another_mesh(self):
    root = self.create_tempdir().full_path
    single_dir = os.path.join(root, "single")
    multi_dir = os.path.join(root, "multi")
    self._run([(_argv(single_dir, _DATA_MESH), _child_env(8))])
    address = f"127.0.0.1:{_free_port()}"
    self._run([(_argv(multi_dir, _DATA_MESH, coordinator_address=address,
                      num_processes=2, process_id=i), _child_env(4))
               for i in range(2)])

    single = self._losses(single_dir)
    multi = self._losses(multi_dir)
    logging.info("Losses, 1 process: %s; 2 processes: %s.", single, multi)
    self.assertEqual(sorted(single), list(range(1, _STEPS + 1)))
    self.assertEqual(sorted(multi), list(range(1, _STEPS + 1)))
    for step in single:
      self.assertAlmostEqual(multi[step], single[step],
                             delta=_RTOL * abs(single[step]), msg=step)
    self.assertLess(multi[_STEPS], multi[1])  # It trains.
    # Process 0 alone wrote the config and metrics; all wrote checkpoints.
    self.assertTrue(os.path.exists(os.path.join(multi_dir, "config.json")))
    with open(os.path.join(multi_dir, "metrics.jsonl")) as f:
      self.assertLen(f.readlines(), _STEPS)
    self.assertEqual(sorted(os.listdir(os.path.join(multi_dir,
                                                    "checkpoints"))),
                     ["2", "4"])

    # Resume the two-process run's step-2 checkpoint in one process on an
    # FSDP mesh.
    resumed_dir = os.path.join(root, "resumed")
    shutil.copytree(multi_dir, resumed_dir)
    shutil.rmtree(os.path.join(resumed_dir, "checkpoints", "4"))
    os.remove(os.path.join(resumed_dir, "metrics.jsonl"))
    self._run([(_argv(resumed_dir, _FSDP_MESH), _child_env(8))])
    resumed = self._losses(resumed_dir)
    logging.info("Losses resumed on the FSDP mesh: %s.", resumed)
    self.assertEqual(sorted(resumed), [3, 4])  # Resumed after update 2.
    for step in resumed:
      self.assertAlmostEqual(resumed[step], single[step],
                             delta=_RTOL * abs(single[step]), msg=step)


if __name__ == "__main__":
  absltest.main()
