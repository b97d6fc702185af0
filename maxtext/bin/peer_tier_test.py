"""The peer tier: a process whose local checkpoints are gone resumes from its
peer's copy, exactly.

Two `maxtext.bin.train` processes on 127.0.0.1, 4 fake CPU devices each, the
mesh's `data` axis across them (FSDP inside each): the local tier saves
every update on each process's own folder (`checkpoint.local_peers`), the
persistent tier only at the end. Both are SIGKILLed after a local save that
has no persistent copy and process 1's local folder is deleted; the restart
must resume from process 0's copy of that step. Then, killed again, with
process 1's folder deleted and process 0's newest step corrupted (a flipped
byte fails its manifest), the restart must resume from the step before. The
finished run's losses, gradient norms and final state must equal an
uninterrupted run's bit for bit.
"""

import glob
import os
import shutil

from absl.testing import absltest
import jax
import numpy as np
import orbax.checkpoint as ocp

from maxtext.checkpoint import manager as checkpoint_lib
from maxtext.checkpoint import peer
from testing import train_process

_STEPS = 12
_OVERRIDES = {
    "train.steps": _STEPS,
    "checkpoint.every_steps": 0,  # Persistent: at the end only.
    "checkpoint.local_dir": "local",
    "checkpoint.local_every_steps": 1,
    "checkpoint.local_max_to_keep": 2,
    "checkpoint.local_peers": True,
    "mesh.ici.data": 2,
    "mesh.ici.fsdp": 4,
}
_TIMEOUT_S = 180


def _local_steps(workdir: str, process: int) -> list[int]:
  folder = os.path.join(workdir, "local", f"{peer.PROCESS_DIR_PREFIX}{process}")
  return sorted(int(n) for n in os.listdir(folder) if n.isdigit()) if (
      os.path.isdir(folder)) else []


def _final_state(workdir: str):
  path = os.path.join(workdir, "checkpoints", str(_STEPS),
                      checkpoint_lib.STATE_ITEM)
  # On this process's one device: as numpy arrays.
  with ocp.PyTreeCheckpointer() as checkpointer:
    tree = checkpointer.metadata(path).item_metadata.tree
    return checkpointer.restore(path, args=ocp.args.PyTreeRestore(
        restore_args=jax.tree.map(
            lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)))


class _Pair:
  """Two processes of one run."""

  def __init__(self, workdir: str, log_dir: str, name: str, **overrides):
    address = f"127.0.0.1:{train_process.free_port()}"
    self.runs = [train_process.TrainProcess(
        workdir, {**_OVERRIDES, **overrides},
        log_path=os.path.join(log_dir, f"{name}_p{i}.log"), num_devices=4,
        flags={"coordinator_address": address, "num_processes": 2,
               "process_id": i}) for i in range(2)]

  def finish(self) -> list[int | str]:
    statuses = []
    for run in self.runs:  # Both are waited for, whichever hangs.
      try:
        statuses.append(run.finish(_TIMEOUT_S))
      except TimeoutError as e:
        statuses.append(str(e))
    return statuses

  def kill(self) -> None:
    for run in self.runs:
      run.kill()

  def tail(self) -> str:
    return "\n".join(run.tail() for run in self.runs)


class PeerTierTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.logs = (os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR") or
                 self.create_tempdir().full_path)

  def _kill_after_local_save(self, pair: _Pair, workdir: str, after: int):
    """SIGKILLs both once each holds a local save of a step > `after`."""
    self.assertTrue(pair.runs[0].wait_until(
        lambda: min(max(_local_steps(workdir, p), default=0)
                    for p in range(2)) > after, _TIMEOUT_S), pair.tail())
    pair.kill()
    self.assertEqual(glob.glob(os.path.join(workdir, "checkpoints", "[0-9]*")),
                     [], "a persistent save before the end")

  def _assert_resumed_from_peer(self, pair: _Pair, step: int) -> None:
    run0, run1 = pair.runs
    self.assertTrue(run0.wait_until(run0.restored, _TIMEOUT_S), pair.tail())
    self.assertEqual(run0.restored()[1], step, pair.tail())
    self.assertTrue(run1.wait_until(
        lambda: "of the local tier from its copy on processes [0]" in
        run1.log(), _TIMEOUT_S), pair.tail())

  def test_a_lost_local_folder_restores_from_the_peer_exactly(self):
    root = self.create_tempdir().full_path
    reference = os.path.join(root, "reference")
    self.assertEqual(_Pair(reference, self.logs, "reference").finish(),
                     [0, 0])
    workdir = os.path.join(root, "run")
    pair = _Pair(workdir, self.logs, "killed")
    self._kill_after_local_save(pair, workdir, after=2)
    newest = _local_steps(workdir, 0)[-1]
    shutil.rmtree(os.path.join(workdir, "local", "process_1"))

    pair = _Pair(workdir, self.logs, "from_peer")
    self._assert_resumed_from_peer(pair, newest)
    self._kill_after_local_save(pair, workdir, after=newest + 1)
    older, newest = _local_steps(workdir, 0)[-2:]
    shutil.rmtree(os.path.join(workdir, "local", "process_1"))
    state = os.path.join(workdir, "local", "process_0", str(newest), "state")
    biggest = max((p for p in glob.glob(os.path.join(state, "**"),
                                        recursive=True) if os.path.isfile(p)),
                  key=os.path.getsize)
    with open(biggest, "r+b") as f:
      byte = f.read(1)
      f.seek(0)
      f.write(bytes([byte[0] ^ 1]))

    pair = _Pair(workdir, self.logs, "older_from_peer")
    self._assert_resumed_from_peer(pair, older)
    self.assertEqual(pair.finish(), [0, 0], pair.tail())
    self.assertIn(f"Checkpoint of step {newest}", pair.runs[0].log())

    want = train_process.losses(reference)
    got = train_process.losses(workdir)
    self.assertEqual(sorted(got), list(range(1, _STEPS + 1)))
    for step in range(1, _STEPS + 1):
      for key in ("train/loss", "grads/global_norm"):
        self.assertEqual(got[step][key], want[step][key], (step, key))
    final, expected = _final_state(workdir), _final_state(reference)
    self.assertEqual(jax.tree.structure(final), jax.tree.structure(expected))
    jax.tree.map(np.testing.assert_array_equal, final, expected)

  def test_a_mesh_without_a_replica_per_process_is_refused(self):
    workdir = os.path.join(self.create_tempdir().full_path, "run")
    pair = _Pair(workdir, self.logs, "fsdp_only",
                 **{"mesh.ici.data": 1, "mesh.ici.fsdp": 8})
    self.assertEqual(pair.finish(), [1, 1], pair.tail())
    for run in pair.runs:
      [line] = [l for l in run.log().splitlines() if "train: error:" in l]
      self.assertIn("checkpoint.local_peers=True needs a replica", line)
      self.assertIn("'data': 1, 'fsdp': 8", line)
      self.assertIn("mesh.ici.data=2, mesh.ici.fsdp=4", line)


if __name__ == "__main__":
  absltest.main()
