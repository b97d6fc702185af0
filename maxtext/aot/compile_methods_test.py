"""Tests of maxtext.aot.compile_preference and compile_distill: the DPO, ORPO
and distillation train steps compiled ahead of time are the steps their
trainers run.

On cpu:8 (data 2 x fsdp 4) each compiled step, given the trainer's own
(model, optimizer) state before its first update and the batch the trainer
prepared for it (reference log-likelihoods, teacher outputs), returns the
trainer's loss, metrics and gradient norm and leaves its parameters, bit for
bit; each compiles for a v5e:2x2 TPU slice on this CPU host.

Needs 8 CPU devices (JAX_NUM_CPU_DEVICES=8).
"""

import os

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import numpy as np

from maxtext.aot import compile_distill
from maxtext.aot import compile_preference
from maxtext.aot import compile_tunix
from maxtext.aot import topology
from maxtext.posttrain import distill
from maxtext.posttrain import posttrain_testing as pt
from maxtext.posttrain import sft
from maxtext.posttrain.config import PosttrainConfig
from testing import devices


def _preferences(count: int) -> list[dict[str, str]]:
  return [{"prompt": f"{pt.word(i % 8)} {pt.word(10 + i % 4)}",
           "chosen": pt.word(20 + i % 10), "rejected": pt.word(60 + i % 7)}
          for i in range(count)]


class CompileMethodsTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.folder = self.create_tempdir().full_path

  def _preference_config(self, method: str, **lora):
    config = pt.dpo_test_config(
        self.folder, pt.write_checkpoint(self.folder), steps=1,
        train_file=pt.write_jsonl(os.path.join(self.folder, "pairs.jsonl"),
                                  _preferences(16)), method=method)
    config.lora.update(lora)
    config.mesh.ici.update(data=2, fsdp=-1)
    return config

  def _distill_config(self):
    teacher_dir = os.path.join(self.folder, "teacher")
    os.makedirs(teacher_dir)
    config = pt.distill_test_config(
        self.folder, pt.write_checkpoint(self.folder, seed=2),
        pt.write_checkpoint(teacher_dir, seed=1), steps=1,
        train_file=pt.write_jsonl(os.path.join(self.folder, "train.jsonl"),
                                  pt.mapping_records(16)))
    config.distill.update(alpha=0.7, beta=0.5, feature_layers=((0, 1),))
    config.mesh.ici.update(data=2, fsdp=-1)
    return config

  def _assert_compiled_equals_trainer(self, config, compile_fn, run_fn):
    devices.require_devices(8)
    typed = PosttrainConfig.from_config_dict(config)
    compiled = compile_fn(typed, topology.hardware_for("cpu:8"))
    with pt.first_steps() as records:
      run_fn(config, os.path.join(self.folder, "run"))
    (record,) = records
    model, optimizer = compiled.merge(record["state"])
    loss, aux, grad_norm = compiled.nnx_compiled(
        model, optimizer, compiled.put(record["example"]))
    want_loss, want_aux, want_norm = record["out"]
    self.assertEqual(float(loss), float(want_loss))
    self.assertEqual(float(grad_norm), float(want_norm))
    self.assertGreater(float(want_norm), 0.0)
    jax.tree.map(np.testing.assert_array_equal, aux, want_aux)
    jax.tree.map(np.testing.assert_array_equal,
                 nnx.to_pure_dict(nnx.state(model, nnx.Param)),
                 record["params"])
    return typed, aux

  @parameterized.parameters(dict(method="dpo"),
                            dict(method="orpo", mode="lora", rank=4))
  def test_preference_step_is_the_trainers(self, method, **lora):
    _, aux = self._assert_compiled_equals_trainer(
        self._preference_config(method, **lora),
        compile_preference.compile_preference_step, sft.run)
    self.assertIn("rewards/margin", aux)
    self.assertEqual("odds_ratio" in aux, method == "orpo")

  def test_distill_step_is_the_trainers(self):
    _, aux = self._assert_compiled_equals_trainer(
        self._distill_config(), compile_distill.compile_distill_step,
        distill.run)
    self.assertGreater(float(aux["distill/feature"]), 0.0)

  def test_each_compiles_for_a_tpu_slice_on_this_host(self):
    hardware = topology.hardware_for("v5e:2x2")
    for config, compile_fn in (
        (self._preference_config("dpo"),
         compile_preference.compile_preference_step),
        (self._distill_config(), compile_distill.compile_distill_step)):
      config.mesh.ici.update(data=1, fsdp=-1)
      report = compile_tunix.analyse(
          compile_fn(PosttrainConfig.from_config_dict(config), hardware))
      self.assertTrue(report.fits)
      self.assertGreater(report.xla_flops, 0)

  def test_other_methods_are_named(self):
    config = PosttrainConfig.from_config_dict(self._distill_config())
    hardware = topology.hardware_for("v5e:2x2")
    with self.assertRaisesRegex(ValueError, "train.method='distill': this"
                                " compiles the .'dpo', 'orpo'. steps"):
      compile_preference.compile_preference_step(config, hardware)


if __name__ == "__main__":
  absltest.main()
