"""Elastic restart: a checkpoint resumes on another device count and mesh.

Runs the train binary (tiny Gemma 3, synthetic tokens) as child processes
with fake CPU devices: a reference of `_STEPS` updates on 8 devices
(data parallel), the same run stopped after `_STOP` updates, then resumed
  * on 4 devices (data parallel) and
  * on 2 devices (FSDP: parameters sharded),
each of whose remaining losses must match the reference (to `_RTOL`: the
gradient reductions sum in another order), and
  * on 3 devices, where the global batch of 8 cannot be split: one error
    line naming the batch size and the mesh, exit status 1, and the
    checkpoint left as it was.
"""

import os
import shutil

from absl.testing import absltest

from testing import train_process

_STEPS = 4
_STOP = 2
# Losses after updates whose gradients were summed in another order.
_RTOL = 1e-4
_TIMEOUT_S = 180
# The schedule must not depend on train.steps, which the first run lowers.
_OVERRIDES = {"optimizer.decay_steps": _STEPS, "checkpoint.every_steps": 0}
_DATA = {"mesh.ici.data": -1, "mesh.ici.fsdp": 1}
_FSDP = {"mesh.ici.data": 1, "mesh.ici.fsdp": -1}


class ElasticRestartTest(absltest.TestCase):

  def _train(self, workdir: str, num_devices: int, steps: int,
             mesh: dict[str, int]) -> train_process.TrainProcess:
    run = train_process.TrainProcess(
        workdir, {**_OVERRIDES, **mesh, "train.steps": steps},
        log_path=os.path.join(self.create_tempdir().full_path, "run.log"),
        num_devices=num_devices)
    run.finish(timeout_s=_TIMEOUT_S)
    return run

  def test_resumes_on_other_device_counts_and_refuses_an_impossible_one(self):
    root = self.create_tempdir().full_path
    reference_dir = os.path.join(root, "reference")
    run = self._train(reference_dir, 8, _STEPS, _DATA)
    self.assertEqual(run.process.returncode, 0, run.tail())
    reference = train_process.losses(reference_dir)
    stopped_dir = os.path.join(root, "stopped")
    run = self._train(stopped_dir, 8, _STOP, _DATA)
    self.assertEqual(run.process.returncode, 0, run.tail())

    for name, num_devices, mesh in (("data4", 4, _DATA), ("fsdp2", 2, _FSDP)):
      workdir = os.path.join(root, name)
      shutil.copytree(stopped_dir, workdir)
      run = self._train(workdir, num_devices, _STEPS, mesh)
      self.assertEqual(run.process.returncode, 0, run.tail())
      self.assertEqual(run.restored(), (
          os.path.join(workdir, "checkpoints", str(_STOP)), _STOP))
      resumed = train_process.losses(workdir)
      self.assertEqual(sorted(resumed), list(range(1, _STEPS + 1)))
      for step in range(_STOP + 1, _STEPS + 1):
        want = reference[step]["train/loss"]
        self.assertAlmostEqual(resumed[step]["train/loss"], want,
                               delta=_RTOL * abs(want), msg=(name, step))

    workdir = os.path.join(root, "three")
    shutil.copytree(stopped_dir, workdir)
    run = self._train(workdir, 3, _STEPS, _DATA)
    self.assertEqual(run.process.returncode, 1, run.tail())
    last = run.log().strip().splitlines()[-1]
    self.assertRegex(last, r"^train: error: ValueError: train.batch_size=8"
                     r" must be divisible by the 3 batch shards")
    self.assertNotIn("Traceback", run.log())
    self.assertEqual(os.listdir(os.path.join(workdir, "checkpoints")),
                     [str(_STOP)])


if __name__ == "__main__":
  absltest.main()
