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
import subprocess
import time

from absl import logging
from absl.testing import absltest

from testing import train_process

# fp32 throughout; the cross-process all-reduce (gloo) may sum the gradient
# shards in another order than the in-process one, and the losses follow
# updates from those gradients.
_RTOL = 1e-4
_TIMEOUT_S = 90
_STEPS = 4
_OVERRIDES = {"train.steps": _STEPS, "checkpoint.every_steps": 2}
_DATA_MESH = {"mesh.ici.data": -1, "mesh.ici.fsdp": 1}
_FSDP_MESH = {"mesh.ici.data": 1, "mesh.ici.fsdp": -1}


def _argv(workdir: str, mesh: dict[str, int], **flags) -> list[str]:
  return train_process.train_argv(workdir, {**_OVERRIDES, **mesh}, flags)


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
        procs.append((subprocess.Popen(
            argv, env=env, cwd=train_process.ROOT, stdout=log,
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
    return {step: m["train/loss"]
            for step, m in train_process.losses(workdir).items()}

  def test_two_processes_equal_one_and_restore_on_another_mesh(self):
    root = self.create_tempdir().full_path
    single_dir = os.path.join(root, "single")
    multi_dir = os.path.join(root, "multi")
    self._run([(_argv(single_dir, _DATA_MESH), train_process.child_env(8))])
    address = f"127.0.0.1:{train_process.free_port()}"
    self._run([(_argv(multi_dir, _DATA_MESH, coordinator_address=address,
                      num_processes=2, process_id=i), train_process.child_env(4))
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
      train_lines = [line for line in f if "train/loss" in line]
    self.assertLen(train_lines, _STEPS)
    self.assertEqual(sorted(os.listdir(os.path.join(multi_dir,
                                                    "checkpoints"))),
                     ["2", "4"])

    # Resume the two-process run's step-2 checkpoint in one process on an
    # FSDP mesh.
    resumed_dir = os.path.join(root, "resumed")
    shutil.copytree(multi_dir, resumed_dir)
    shutil.rmtree(os.path.join(resumed_dir, "checkpoints", "4"))
    os.remove(os.path.join(resumed_dir, "metrics.jsonl"))
    self._run([(_argv(resumed_dir, _FSDP_MESH), train_process.child_env(8))])
    resumed = self._losses(resumed_dir)
    logging.info("Losses resumed on the FSDP mesh: %s.", resumed)
    self.assertEqual(sorted(resumed), [3, 4])  # Resumed after update 2.
    for step in resumed:
      self.assertAlmostEqual(resumed[step], single[step],
                             delta=_RTOL * abs(single[step]), msg=step)


if __name__ == "__main__":
  absltest.main()
