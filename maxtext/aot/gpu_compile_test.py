"""Tests of compile-only GPU targets with jax's CUDA PJRT plugin
(`//maxtext/aot:cuda_plugin`, @pypi_gpu): the tiny train step compiled for
h200:8 on this CPU-only host, against the same step compiled for cpu:8, and
the Pallas (Triton) attention that "auto" takes where cuDNN does not serve.

Needs 8 CPU devices (JAX_NUM_CPU_DEVICES=8) and
JAX on the CPU platform (set below), which the plugin needs to load without a
GPU. cuDNN attention for these devices: gpu_cudnn_compile_test.
"""

import collections
from importlib import metadata
import re

from absl.testing import absltest
import jax

from maxtext.aot import aot_testing
from maxtext.aot import compile_step
from maxtext.aot import tiny_experiment
from testing import devices

_CUSTOM_CALL_RE = re.compile(r'custom_call_target="([^"]+)"')


class GpuCompileTest(absltest.TestCase):

  def test_plugin_is_at_jax_version(self):
    # The plugin is locked separately from jax (requirements_gpu.in); JAX
    # refuses a plugin built for another version.
    for package in ("jax-cuda12-pjrt", "jax-cuda12-plugin"):
      self.assertEqual(metadata.version(package), jax.__version__, package)

  def test_train_step_on_h200_matches_cpu(self):
    devices.require_devices(8)
    # bfloat16 as on a real GPU; plain-JAX attention needs no cuDNN.
    experiment = tiny_experiment.tiny_experiment(
        scan_layers=False, dtype="bfloat16", attention_impl="reference")
    step, report = aot_testing.compile_for(experiment, "h200:8")
    self.assertLen(step.hardware.devices, 8)
    self.assertEqual(step.hardware.device_kind, "NVIDIA H200")
    self.assertEqual({d.platform for d in step.hardware.devices}, {"gpu"})
    self.assertEqual(report.memory_bytes, int(0.75 * 143_771 * 2**20))
    self.assertEqual(dict(step.mesh.shape)["fsdp"], 8)
    _, cpu_report = aot_testing.compile_for(experiment, "cpu:8")
    # The same state and batch, split the same way over 8 devices: each
    # device's inputs, outputs and donated bytes are the CPU program's.
    self.assertEqual(
        (report.argument_bytes, report.output_bytes, report.alias_bytes),
        (cpu_report.argument_bytes, cpu_report.output_bytes,
         cpu_report.alias_bytes))
    self.assertGreater(report.temp_bytes, 0)
    self.assertTrue(report.fits)
    # FSDP gathers the parameters and reduces the gradients.
    self.assertIn("all-gather", report.collectives)
    self.assertIn("reduce-scatter", report.collectives)
    text = compile_step.format_report(report, step)
    self.assertIn("Train step on h200:8: 8 x NVIDIA H200", text)
    self.assertIn("n/a: XLA gives no cost analysis for this target", text)

  def test_auto_attention_in_float32_is_triton(self):
    # cuDNN takes no float32, so "auto" takes the Pallas kernels
    # (`maxtext.kernels.pallas_gpu`), which XLA compiles through Triton.
    experiment = tiny_experiment.tiny_experiment(scan_layers=False,
                                                 dtype="float32")
    step, _ = aot_testing.compile_for(experiment, "h100:8")
    targets = collections.Counter(_CUSTOM_CALL_RE.findall(
        step.compiled.as_text()))
    # At least a forward and a backward kernel per layer; no cuDNN.
    self.assertGreaterEqual(targets["__gpu$xla.gpu.triton"],
                            2 * experiment.model.num_layers, targets)
    self.assertFalse([t for t in targets if t.startswith("__cudnn")], targets)


if __name__ == "__main__":
  # The CUDA plugin loads without a GPU only while JAX runs on the CPU.
  jax.config.update("jax_platforms", "cpu")
  absltest.main()
