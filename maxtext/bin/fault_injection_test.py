"""Fault injection: a train run killed and resumed equals an uninterrupted one.

Runs `python -m maxtext.bin.train` (a tiny Gemma 3 on synthetic tokens, one
CPU device) as child processes, with a local checkpoint tier every
`_LOCAL_EVERY` updates and the persistent tier every `_PERSISTENT_EVERY`:

  * reference: `_STEPS` updates, uninterrupted;
  * SIGKILL: killed at random updates and while an async save is in flight
    (its temporary folder on disk), once with the newest checkpoint corrupted
    (a flipped byte) before the restart, and resumed each time until done;
  * SIGTERM: preempted at random updates; each run must exit with
    `EXIT_CODE_PREEMPTED` after checkpointing the update it stopped at.

Every resumed run must restore the newest intact checkpoint of either tier,
and the finished run must equal the reference exactly: the loss and gradient
norm of every update (metrics.jsonl) and the final parameters and optimizer
state, bit for bit. The kill schedule comes from a fixed seed; the test logs
the kills survived and the most updates a kill cost.
"""

import glob
import os
import random
import signal

from absl import logging
from absl.testing import absltest
import jax
import numpy as np
import orbax.checkpoint as ocp

from maxtext.checkpoint import manager as checkpoint_lib
from maxtext.trainers import preemption
from testing import train_process

_STEPS = 30
_LOCAL_EVERY = 3
_PERSISTENT_EVERY = 10
_OVERRIDES = {
    "train.steps": _STEPS,
    "checkpoint.every_steps": _PERSISTENT_EVERY,
    "checkpoint.max_to_keep": 2,
    "checkpoint.async_save": True,
    "checkpoint.local_dir": "local",
    "checkpoint.local_every_steps": _LOCAL_EVERY,
    "checkpoint.local_max_to_keep": 2,
}
_SEED = 1234
_TIMEOUT_S = 240  # Per child run.
# Kinds of SIGKILL, in order: at an update, or during an async save.
_KILLS = ("update", "save", "update", "save", "update", "save")
_CORRUPT_AFTER_KILL = 2  # Flip a byte in the newest checkpoint after it.
_TERMS = 2


def _tiers(workdir: str) -> list[str]:
  return [os.path.join(workdir, "local"), os.path.join(workdir, "checkpoints")]


def _committed(workdir: str) -> list[tuple[str, int]]:
  """(folder, step) of every finished checkpoint of either tier, in the
  order restore tries them: newest first, the local tier first on a tie."""
  out = []
  for rank, tier in enumerate(_tiers(workdir)):
    if os.path.isdir(tier):
      out += [(int(name), rank, os.path.join(tier, name))
              for name in os.listdir(tier) if name.isdigit()]
  return [(path, step) for step, _, path in sorted(
      out, key=lambda c: (-c[0], c[1]))]


def _unfinished(workdir: str) -> list[str]:
  return [path for tier in _tiers(workdir) for path in glob.glob(
      os.path.join(tier, "*" + checkpoint_lib.ORBAX_TMP_SUFFIX))]


def _saving_step(workdir: str) -> int:
  """The step of a local save in flight (its temporary folder), or -1."""
  names = [os.path.basename(p) for p in _unfinished(workdir)]
  return max((int(n.split(".")[0]) for n in names), default=-1)


def _reached(run: train_process.TrainProcess, kind: str, target: int):
  """When to signal `run`: once it logged update `target` ("update"), or
  ("save") while a local save at or after `target` is still on its way to
  disk, failing that (a save too quick to catch) at a later update."""
  if kind == "update":
    return lambda: run.logged_step() >= target
  return lambda: (_saving_step(run.workdir) >= target or
                  run.logged_step() >= target + 2 * _LOCAL_EVERY)


def _log_dir(test: absltest.TestCase) -> str:
  """Where Bazel keeps a test's outputs (test.outputs/outputs.zip), so that
  the children's logs of a failed run can be read; else a temporary
  folder."""
  return (os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR") or
          test.create_tempdir().full_path)


def _flip_a_byte(step_dir: str) -> str:
  files = [p for p in glob.glob(os.path.join(step_dir, "state", "**"),
                                recursive=True) if os.path.isfile(p)]
  path = max(files, key=os.path.getsize)
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0x01]))
  return path


def _final_state(workdir: str):
  path = os.path.join(workdir, "checkpoints", str(_STEPS),
                      checkpoint_lib.STATE_ITEM)
  with ocp.StandardCheckpointer() as checkpointer:
    return checkpointer.restore(path)


class FaultInjectionTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = absltest.get_default_test_tmpdir()
    cls.reference_dir = os.path.join(cls.root, "reference")
    run = train_process.TrainProcess(
        cls.reference_dir, _OVERRIDES,
        log_path=os.path.join(cls.root, "reference.log"))
    status = run.finish(timeout_s=_TIMEOUT_S)
    if status:
      raise AssertionError(f"Reference run exited {status}:\n{run.tail()}")
    cls.reference = train_process.losses(cls.reference_dir)
    cls.reference_state = _final_state(cls.reference_dir)

  def _start(self, workdir: str, name: str) -> train_process.TrainProcess:
    return train_process.TrainProcess(
        workdir, _OVERRIDES,
        log_path=os.path.join(self.create_tempdir().full_path, name + ".log"))

  def _assert_equals_reference(self, workdir: str) -> None:
    resumed = train_process.losses(workdir)
    self.assertEqual(sorted(resumed), list(range(1, _STEPS + 1)))
    for step in range(1, _STEPS + 1):
      for key in ("train/loss", "grads/global_norm"):
        self.assertEqual(resumed[step][key], self.reference[step][key],
                         (step, key))
    self.assertLess(resumed[_STEPS]["train/loss"], resumed[1]["train/loss"])
    state = _final_state(workdir)
    self.assertEqual(jax.tree.structure(state),
                     jax.tree.structure(self.reference_state))
    jax.tree.map(np.testing.assert_array_equal, state, self.reference_state)
    self.assertEqual(_unfinished(workdir), [])  # Killed saves cleaned up.

  def test_sigkill_anywhere_resumes_exactly(self):
    rng = random.Random(_SEED)
    workdir = os.path.join(self.create_tempdir().full_path, "run")
    expected_restore = None  # (folder, step) the next run must resume from.
    report = []  # (kind, logged update at the kill, restored update).
    for index, kind in enumerate(_KILLS + ("none",)):
      run = self._start(workdir, f"run{index}")
      start = 0
      if expected_restore is not None:
        run.wait_until(run.restored, _TIMEOUT_S)
        self.assertEqual(run.restored(), expected_restore, run.tail())
        start = expected_restore[1]
        report[-1] += (start,)
      if kind == "none":
        self.assertEqual(run.finish(_TIMEOUT_S), 0, run.tail())
        break
      target = rng.randint(start + 1, _STEPS - 2 * _LOCAL_EVERY - 2)
      self.assertTrue(run.wait_until(_reached(run, kind, target), _TIMEOUT_S),
                      f"run {index} ended before update {target}:\n"
                      f"{run.tail()}")
      logged = run.logged_step()
      run.kill()
      in_save = bool(_unfinished(workdir))
      report.append((kind if kind == "update" or in_save else "update",
                     logged))
      committed = _committed(workdir)
      self.assertNotEmpty(committed, run.tail())
      expected_restore = committed[0]
      if index == _CORRUPT_AFTER_KILL:
        bad = _flip_a_byte(expected_restore[0])
        logging.info("Corrupted %s.", bad)
        expected_restore = committed[1]
    lost = [logged - restored for _, logged, restored in report]
    logging.info("SIGKILL: %d kills survived (%d during an async save);"
                 " updates lost per kill (logged - resumed): %s, max %d.",
                 len(report), sum(k == "save" for k, *_ in report), lost,
                 max(lost))
    self.assertLen(report, len(_KILLS))
    self.assertGreaterEqual(sum(k == "save" for k, *_ in report), 1, report)
    self.assertTrue(all(n >= 0 for n in lost), report)
    self._assert_equals_reference(workdir)

  def test_sigterm_checkpoints_and_resumes_exactly(self):
    rng = random.Random(_SEED + 1)
    workdir = os.path.join(self.create_tempdir().full_path, "run")
    stopped_at = None
    for index in range(_TERMS + 1):
      run = self._start(workdir, f"run{index}")
      start = 0
      if stopped_at is not None:
        run.wait_until(run.restored, _TIMEOUT_S)
        # Resumed exactly where the preempted run stopped: nothing lost.
        self.assertEqual(run.restored()[1], stopped_at, run.tail())
        start = stopped_at
      if index == _TERMS:
        self.assertEqual(run.finish(_TIMEOUT_S), 0, run.tail())
        break
      target = rng.randint(start + 1, _STEPS - 3)
      self.assertTrue(run.wait_until(_reached(run, "update", target),
                                     _TIMEOUT_S), run.tail())
      logged = run.logged_step()
      run.signal(signal.SIGTERM)
      self.assertEqual(run.finish(_TIMEOUT_S),
                       preemption.EXIT_CODE_PREEMPTED, run.tail())
      stopped_at = int(run.log().split("Preempted after update ")[1]
                       .split(";")[0])
      self.assertGreaterEqual(stopped_at, logged)
      logging.info("SIGTERM after logged update %d: stopped and saved at"
                   " update %d.", logged, stopped_at)
    self._assert_equals_reference(workdir)

  def test_sigterm_to_one_of_two_processes_stops_both_at_one_update(self):
    workdir = os.path.join(self.create_tempdir().full_path, "run")
    address = f"127.0.0.1:{train_process.free_port()}"
    runs = [train_process.TrainProcess(
        workdir, {**_OVERRIDES, "train.steps": 10 * _STEPS},
        log_path=os.path.join(_log_dir(self), f"two_processes_p{i}.log"),
        flags={"coordinator_address": address, "num_processes": 2,
               "process_id": i}) for i in range(2)]
    try:
      self.assertTrue(runs[0].wait_until(_reached(runs[0], "update", 3),
                                         _TIMEOUT_S), runs[0].tail())
      runs[1].signal(signal.SIGTERM)  # Process 0 is not signalled.
    finally:
      # Both are waited for (and killed if stuck), whichever hangs.
      statuses = []
      for run in runs:
        try:
          statuses.append(run.finish(_TIMEOUT_S))
        except TimeoutError as e:
          statuses.append(str(e))
    self.assertEqual(statuses, [preemption.EXIT_CODE_PREEMPTED] * 2,
                     runs[0].tail() + runs[1].tail())
    stopped = {int(run.log().split("Preempted after update ")[1]
                   .split(";")[0]) for run in runs}
    self.assertLen(stopped, 1)
    [step] = stopped
    self.assertLess(step, 10 * _STEPS)
    ckpt = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
                                       max_to_keep=2, async_save=False)
    self.addCleanup(ckpt.close)
    self.assertIn(step, ckpt.all_steps())
    self.assertEqual(ckpt.check(step), [])
    logging.info("Two processes, SIGTERM to process 1: both stopped and"
                 " saved at update %d.", step)


if __name__ == "__main__":
  absltest.main()
