"""Tests of maxtext.aot.saved_step: save, load and run; refuse mismatches.

Needs 8 CPU devices (JAX_NUM_CPU_DEVICES=8) and
libtpu.
"""

import json
import os
import zipfile

from absl.testing import absltest
import jax
import numpy as np

from maxtext.aot import compile_step
from maxtext.aot import saved_step
from maxtext.aot import tiny_experiment
from maxtext.aot import topology
from maxtext.sharding import mesh as mesh_lib
from maxtext.trainers import step_setup
from maxtext.trainers import train_state as train_state_lib
from maxtext.trainers import train_step as train_step_lib
from maxtext.trainers.config import ExperimentConfig
from testing import devices


def _compiled(experiment, name):
  return compile_step.compile_train_step(experiment,
                                        topology.hardware_for(name))


def _batch(inputs, seed=0):
  """A random batch laid out as the step expects."""
  rng = np.random.default_rng(seed)
  return {key: jax.device_put(
      rng.integers(0, 128, spec.shape, dtype=np.int32), spec.sharding)
          for key, spec in inputs.batch_specs.items()}


class SavedStepTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    devices.require_devices(8)
    saved_step.disable_compilation_cache()
    cls.experiment = tiny_experiment.tiny_experiment(
        dict(data=2, fsdp=4), num_layers=1)
    cls.step = _compiled(cls.experiment, "cpu:8")
    cls.path = os.path.join(absltest.get_default_test_tmpdir(), "step.aot")
    saved_step.save_compiled(cls.path, cls.step, cls.experiment)

  def _run_inputs(self, experiment, devices):
    """A fresh run's mesh, state and batch, built as `train` builds them."""
    mesh = mesh_lib.make_mesh(experiment.mesh, devices)
    inputs = step_setup.step_inputs(experiment, mesh)
    state = train_state_lib.create_train_state(experiment.model,
                                               **inputs.state_args)
    return mesh, state, _batch(inputs)

  def test_loaded_step_equals_the_jitted_step(self):
    mesh, state, batch = self._run_inputs(self.experiment, jax.devices())
    loaded = saved_step.load_compiled(self.path, self.experiment, mesh, state,
                                      batch)
    # Both donate the state: the jitted step gets a copy.
    want_state, want_metrics = train_step_lib.train_step(
        jax.tree.map(lambda x: x.copy(), state), batch)
    got_state, got_metrics = loaded(state, batch)
    self.assertEqual(got_metrics.keys(), want_metrics.keys())
    for key in want_metrics:
      np.testing.assert_array_equal(got_metrics[key], want_metrics[key],
                                    err_msg=key)
    jax.tree.map(np.testing.assert_array_equal, got_state.checkpoint_tree(),
                 want_state.checkpoint_tree())
    self.assertEqual(int(got_state.step), 1)

  def test_another_config_is_refused_naming_the_difference(self):
    config = tiny_experiment.tiny_config(dict(data=2, fsdp=4), num_layers=1)
    config.train.batch_size = 16
    config.optimizer.learning_rate = 3e-4
    config.train.seed = 7  # Not part of the step: not reported.
    experiment = ExperimentConfig.from_config_dict(config)
    mesh, state, batch = self._run_inputs(experiment, jax.devices())
    with self.assertRaises(saved_step.MismatchError) as raised:
      saved_step.load_compiled(self.path, experiment, mesh, state, batch)
    message = str(raised.exception)
    self.assertIn("config.train.batch_size: compiled for 8, this run 16",
                  message)
    self.assertIn("config.optimizer.learning_rate: compiled for 0.001, this"
                  " run 0.0003", message)
    self.assertNotIn("seed", message)

  def test_another_topology_is_refused(self):
    experiment = tiny_experiment.tiny_experiment(dict(data=1, fsdp=4),
                                                 num_layers=1)
    mesh, state, batch = self._run_inputs(experiment, jax.devices()[:4])
    with self.assertRaisesRegex(
        saved_step.MismatchError,
        r"config\.mesh\.ici\.data: compiled for 2, this run 1;.*"
        r"topology\.num_devices: compiled for 8, this run 4"):
      saved_step.load_compiled(self.path, experiment, mesh, state, batch)

  def test_a_tpu_step_is_saved_and_refused_on_cpu(self):
    experiment = tiny_experiment.tiny_experiment(num_layers=1)
    path = self.create_tempfile("tpu.aot").full_path
    saved_step.save_compiled(path, _compiled(experiment, "v5e:2x2"),
                             experiment)
    with zipfile.ZipFile(path) as archive:
      saved = json.loads(archive.read("fingerprint.json"))
    self.assertEqual(saved["topology"]["device_kind"], "TPU v5 lite")
    self.assertEqual(saved["topology"]["num_devices"], 4)
    mesh, state, batch = self._run_inputs(experiment, jax.devices()[:4])
    with self.assertRaisesRegex(
        saved_step.MismatchError,
        r"topology\.device_kind: compiled for 'TPU v5 lite', this run 'cpu'"):
      saved_step.load_compiled(path, experiment, mesh, state, batch)

  def test_other_files_are_refused(self):
    path = self.create_tempfile("not_a_step.aot", content="hello").full_path
    mesh, state, batch = self._run_inputs(self.experiment, jax.devices())
    with self.assertRaisesRegex(OSError, "not a train step saved by"):
      saved_step.load_compiled(path, self.experiment, mesh, state, batch)


if __name__ == "__main__":
  absltest.main()
