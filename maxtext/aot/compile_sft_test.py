"""Tests of maxtext.aot.compile_sft: the sft train step compiled ahead of
time is Tunix's jitted step.

On cpu:8 (data 2 x fsdp 4) the compiled step, run on the real model and
optimizer of a tiny Llama checkpoint, gives the same loss, gradient norm and
updated parameters as Tunix's own `PeftTrainer.jit_train_and_eval_step`
(full fine-tuning and LoRA). Saved (`aot_compile --save`) and trained with
(`sft --compiled`), it gives the losses and trained weights of sft compiling
its own step, bit for bit, and a file saved for another run is refused. A
v5e:2x2 TPU slice compiles on this CPU host.

Needs 8 CPU devices (JAX_NUM_CPU_DEVICES=8).
"""

import dataclasses
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
from tunix.sft import peft_trainer

from maxtext.aot import compile_sft
from maxtext.aot import compile_step
from maxtext.aot import compile_tunix
from maxtext.aot import saved_step
from maxtext.aot import topology
from maxtext.data import caption_task
from maxtext.data import pipeline
from maxtext.metrics import flops
from maxtext.metrics import writers
from maxtext.posttrain import base_model
from maxtext.posttrain import posttrain_testing as pt
from maxtext.posttrain import runtime as runtime_lib
from maxtext.posttrain import sft
from maxtext.posttrain.config import PosttrainConfig
from testing import devices


class CompileSftTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Before anything compiles, as aot_compile --save does: the steps saved
    # here must not come from the persistent cache Bazel's tests share.
    saved_step.disable_compilation_cache()
    cls.folder = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    cls.load = pt.write_checkpoint(cls.folder)
    cls.train_file = pt.write_jsonl(os.path.join(cls.folder, "train.jsonl"),
                                    pt.mapping_records(16))

  def _config(self, **lora) -> PosttrainConfig:
    config = pt.sft_test_config(self.folder, self.load, steps=2,
                                train_file=self.train_file, **lora)
    config.optimizer.learning_rate = 1e-2
    config.mesh.ici.update(data=2, fsdp=-1)
    return PosttrainConfig.from_config_dict(config)

  @parameterized.parameters(dict(mode="full"), dict(mode="lora", rank=4))
  def test_cpu_step_equals_tunix_jitted_step(self, **lora):
    self._assert_step_equals_tunix(self._config(**lora))

  def test_vision_language_step_equals_tunix_jitted_step(self):
    """A tiny Gemma 3 with its tower (frozen) on caption records."""
    folder = self.create_tempdir().full_path
    captions = os.path.join(folder, "captions")
    config = pt.sft_test_config(
        folder, pt.write_checkpoint(folder, "gemma3_vlm"), steps=2,
        train_file=caption_task.write(captions, 16))
    config.sft.update(prompt_field="", completion_field="")
    config.data.update(text_field="messages", packing="first_fit",
                       images_per_row=2, image_dir=captions, seq_len=32)
    config.mesh.ici.update(data=2, fsdp=-1)
    compiled = self._assert_step_equals_tunix(
        PosttrainConfig.from_config_dict(config))
    report = compile_tunix.analyse(compiled)
    # Our FLOPs count the tower's forward pass on the 8 x 2 image slots.
    tower = 16 * flops.vision_flops_per_image(compiled.model_cfg,
                                              trained=False)
    text = flops.training_flops_per_token(compiled.model_cfg, 32) * 8 * 32
    self.assertAlmostEqual(report.model_flops * 8, text + tower, delta=1.0)

  def _assert_step_equals_tunix(self, config):
    devices.require_devices(8)
    hardware = topology.hardware_for("cpu:8")
    compiled = compile_sft.compile_sft_step(config, hardware)

    runtime = runtime_lib.make_runtime(config)
    workdir = self.create_tempdir().full_path
    data = sft.data_config(config, workdir)
    loaded = base_model.load_model(config.train.load, lora=config.lora,
                                   seed=config.train.seed,
                                   rules=runtime.rules)
    batches = pipeline.make_train_pipeline(
        data, batch_size=config.train.rows, vocab_size=loaded.cfg.vocab_size,
        image_inputs=sft.image_inputs(loaded, data))
    batch = next(sft.model_batches(batches, pipeline.model_keys(data)))
    batches.close()
    with runtime.activate():
      trainer = peft_trainer.PeftTrainer(
          loaded.model, sft.make_optimizer(config, loaded.cfg),
          runtime_lib.training_config(config, workdir, runtime,
                                      data.seq_len))
      trainer.with_loss_fn(sft.sft_loss)
      # A copy: each step updates its pair in place and donates its
      # optimizer (the model included).
      model, optimizer = compiled.merge(jax.tree.map(
          jnp.copy, nnx.state((trainer.model, trainer.optimizer))))
      batch = compiled.put(batch)
      jitted, _ = trainer.jit_train_and_eval_step()
      want_loss, _, want_norm = jitted(batch)
      got_loss, _, got_norm = compiled.nnx_compiled(model, optimizer, batch)
    self.assertEqual(float(got_loss), float(want_loss))
    self.assertEqual(float(got_norm), float(want_norm))
    self.assertGreater(float(want_norm), 0.0)
    jax.tree.map(np.testing.assert_array_equal,
                 nnx.to_pure_dict(nnx.state(model, nnx.Param)),
                 nnx.to_pure_dict(nnx.state(trainer.model, nnx.Param)))
    return compiled

  @parameterized.parameters(dict(mode="full"), dict(mode="lora", rank=4))
  def test_sft_trains_bit_for_bit_with_the_saved_step(self, **lora):
    """`aot_compile --save` then `sft --compiled` (train.compiled) against
    sft compiling its own step: the same losses and trained weights."""
    devices.require_devices(8)
    config = self._config(**lora)
    path = os.path.join(self.create_tempdir().full_path, "sft_step.zip")
    compiled = compile_sft.compile_sft_step(config,
                                            topology.hardware_for("cpu:8"))
    compile_sft.save(path, compiled, config)

    runs = {}
    for name, file in (("jitted", ""), ("loaded", path)):
      run_config = dataclasses.replace(
          config, train=dataclasses.replace(config.train, compiled=file))
      workdir = self.create_tempdir(name).full_path
      result = sft.run_sft(run_config, workdir)
      train_step, _ = result.trainer.jit_train_and_eval_step()
      runs[name] = (nnx.to_pure_dict(nnx.state(result.model.model,
                                               nnx.Param)),
                    _losses(workdir), getattr(train_step.func, "compiled",
                                              None))
    (jitted, jitted_losses, none), (loaded, loaded_losses, executable) = (
        runs.values())
    # The loaded run called the executable read from the file.
    self.assertIsNone(none)
    self.assertIsInstance(executable, nnx.transforms.compilation.Compiled)
    self.assertLen(loaded_losses, 2)
    self.assertEqual(loaded_losses, jitted_losses)
    jax.tree.map(np.testing.assert_array_equal, loaded, jitted)
    start = base_model.load_model(config.train.load, lora=config.lora,
                                  seed=config.train.seed)
    moved = jax.tree.map(
        lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))),
        nnx.to_pure_dict(nnx.state(start.model, nnx.Param)), loaded)
    self.assertTrue(any(jax.tree.leaves(moved)))

  def test_sft_refuses_a_step_saved_for_another_run(self):
    devices.require_devices(8)
    config = self._config()
    path = os.path.join(self.create_tempdir().full_path, "sft_step.zip")
    compile_sft.save(path, compile_sft.compile_sft_step(
        config, topology.hardware_for("cpu:8")), config)
    other = dataclasses.replace(
        config,
        optimizer=dataclasses.replace(config.optimizer, learning_rate=3e-3),
        train=dataclasses.replace(config.train, compiled=path))
    with self.assertRaisesRegex(
        saved_step.MismatchError,
        r"config.optimizer.learning_rate: compiled for 0.01, this run"
        r" 0.003"):
      sft.run_sft(other, self.create_tempdir().full_path)
    broken = os.path.join(self.create_tempdir().full_path, "broken.zip")
    with open(broken, "wb") as f:
      f.write(b"not a zip")
    with self.assertRaisesRegex(OSError, "is not a train step saved by"):
      sft.run_sft(dataclasses.replace(config, train=dataclasses.replace(
          config.train, compiled=broken)), self.create_tempdir().full_path)

  def test_tpu_slice_compiles_on_this_host(self):
    config = self._config()
    hardware = topology.hardware_for("v5e:2x2")
    compiled = compile_sft.compile_sft_step(config, hardware)
    report = compile_tunix.analyse(compiled)
    self.assertTrue(report.fits)
    self.assertGreater(report.xla_flops, 0)
    self.assertIn("all-gather", report.collectives)
    self.assertIn("v5e HBM", compile_step.format_report(report,
                                                        compiled.step))

  def test_other_methods_are_named(self):
    config = self._config()
    dpo = dataclasses.replace(
        config, train=dataclasses.replace(config.train, method="dpo"))
    with self.assertRaisesRegex(ValueError, "train.method='dpo': this"
                                " compiles the 'sft' step"):
      compile_sft.compile_sft_step(dpo, topology.hardware_for("v5e:2x2"))


def _losses(workdir: str) -> list[float]:
  """train/loss of each logged step of the run in `workdir`."""
  metrics = writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  return [m["train/loss"] for _, m in sorted(metrics.items())
          if "train/loss" in m]


if __name__ == "__main__":
  absltest.main()
