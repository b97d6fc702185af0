"""Tests of maxtext.aot.topology: names, slice shapes and compile-only
devices (libtpu on this CPU host; H100s through jax's CUDA plugin where it
is installed, else the error that says what is missing).

Needs 8 CPU devices (JAX_NUM_CPU_DEVICES=8).
"""

import importlib.util

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from maxtext.aot import compile_step
from maxtext.aot import tiny_experiment
from maxtext.aot import topology
from maxtext.sharding import mesh as mesh_lib



def _has_cuda_plugin() -> bool:
  try:
    return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
  except ModuleNotFoundError:  # No jax_plugins package at all.
    return False

# Slice names and chip grids as Cloud TPU lists them.
_PUBLISHED_GRIDS = {
    "v5e-1": (1, 1), "v5e-4": (2, 2), "v5e-8": (2, 4), "v5e-16": (4, 4),
    "v5e-32": (4, 8), "v5e-64": (8, 8), "v5e-128": (8, 16),
    "v5e-256": (16, 16), "v6e-16": (4, 4), "v6e-256": (16, 16),
    "v4-8": (2, 2, 1), "v4-16": (2, 2, 2), "v4-32": (2, 2, 4),
    "v4-64": (2, 4, 4), "v4-128": (4, 4, 4), "v4-256": (4, 4, 8),
    "v4-512": (4, 8, 8), "v4-1024": (8, 8, 8), "v4-2048": (8, 8, 16),
    "v4-4096": (8, 16, 16), "v5p-8": (2, 2, 1), "v5p-128": (4, 4, 4),
    "v5p-8192": (16, 16, 16),
}


class ParseTest(parameterized.TestCase):

  def test_named_slices_have_the_published_grids(self):
    for name, grid in _PUBLISHED_GRIDS.items():
      target = topology.parse_topology(name)
      self.assertEqual(target.grid, grid, name)
      self.assertEqual(target.num_devices, np.prod(grid), name)
      self.assertEqual(target.platform, "tpu")

  def test_grids_aliases_and_slices(self):
    target = topology.parse_topology("v5p:4x4x12", num_slices=2)
    self.assertEqual((target.libtpu_topology, target.devices_per_slice,
                      target.num_devices), ("v5p:4x4x12", 192, 384))
    self.assertEqual(topology.parse_topology("v5litepod-16").libtpu_topology,
                     "v5e:4x4")
    cpu = topology.parse_topology("cpu:8")
    self.assertEqual((cpu.platform, cpu.num_devices), ("cpu", 8))
    gpu = topology.parse_topology("gpu:8", num_slices=4)
    self.assertEqual((gpu.platform, gpu.num_devices, gpu.gpu),
                     ("gpu", 32, None))
    h200 = topology.parse_topology("H200:8", num_slices=2)
    self.assertEqual((h200.platform, h200.num_devices, h200.gpu.device_kind),
                     ("gpu", 16, "NVIDIA H200"))

  @parameterized.parameters(
      ("v5e-3", 1, r"v5e slices by name have \[1, 4, 8, .* chips; name other"
       r" shapes by their grid, e\.g\. v5e:4x4"),
      ("v5e-512", 1, r"\[1, 4, 8, 16, 32, 64, 128, 256\] chips"),
      ("v5p-6", 1, r"v5p slices by name have \[8, 16, .*\] TensorCores"),
      ("v5p:2x2", 1, r"a v5p grid has 3 positive dimensions"),
      ("v7-8", 1, r"unknown topology\. Valid forms: v5e-256, .*TPU"
       r" generations: \['v4', 'v5e', 'v5p', 'v6e'\]"),
      ("cpu:0", 1, r"the device count must be positive"),
      ("h100:0", 1, r"the device count must be positive"),
      ("a100:8", 1, r"unknown topology\. Valid forms: .* h100:8, h200:8"),
      ("cpu:8", 2, r"CPU devices have no slices"),
      ("v5e-4", 0, r"--num_slices=0 must be a positive integer"),
  )
  def test_bad_names_are_explained(self, name, num_slices, message):
    # hardware_for parses the name first: the same messages.
    for parse in (topology.parse_topology, topology.hardware_for):
      with self.subTest(parse.__name__):
        with self.assertRaisesRegex(ValueError, message):
          parse(name, num_slices)


class DevicesTest(absltest.TestCase):

  def test_v5p_8_is_four_megacore_chips(self):
    hardware = topology.hardware_for("v5p-8")
    self.assertLen(hardware.devices, 4)
    self.assertEqual(hardware.device_kind, "TPU v5")
    self.assertEqual(hardware.devices[0].num_cores, 2)
    self.assertEqual(hardware.peak_flops, 459e12)
    self.assertEqual(hardware.memory_bytes, int(95.74 * 2**30))

  def test_one_chip(self):
    hardware = topology.hardware_for("v5e-1")
    self.assertLen(hardware.devices, 1)
    self.assertEqual(hardware.device_kind, "TPU v5 lite")

  def test_slices_make_a_hybrid_mesh(self):
    hardware = topology.hardware_for("v5e:2x2", num_slices=2)
    self.assertLen(hardware.devices, 8)
    mesh = mesh_lib.make_mesh(
        mesh_lib.MeshConfig(ici=dict(data=1, fsdp=4), dcn=dict(data=2)),
        hardware.devices)
    # Each data-parallel row is one slice: only `data` crosses the network.
    slices = np.vectorize(lambda d: d.slice_index)(mesh.devices).squeeze()
    np.testing.assert_array_equal(slices, [[0] * 4, [1] * 4])

  def test_cpu_devices_must_be_there(self):
    if jax.device_count() != 8:
      self.skipTest("needs JAX_NUM_CPU_DEVICES=8")
    hardware = topology.hardware_for("cpu:8")
    self.assertLen(hardware.devices, 8)
    self.assertEqual(hardware.memory_name, "host memory / 8")
    with self.assertRaisesRegex(
        ValueError, r"'cpu:3' needs 3 cpu devices, this process has 8:.*"
        r"xla_force_host_platform_device_count=3"):
      topology.hardware_for("cpu:3")

  def test_gpu_needs_gpus(self):
    if jax.default_backend() == "gpu":
      self.skipTest("this host has GPUs")
    with self.assertRaisesRegex(
        ValueError, r"'gpu:8' needs 8 gpu devices, this process has 0: run on"
        r" a host with 8 GPUs"):
      topology.hardware_for("gpu:8")

  def test_compile_only_h100s_on_this_host(self):
    if not _has_cuda_plugin():
      with self.assertRaisesRegex(
          ValueError, r"'h100:4': JAX cannot make compile-only NVIDIA H100"
          r" 80GB HBM3 devices .* packages jax-cuda12-pjrt and"
          r" jax-cuda12-plugin at jax's version .* use gpu:N on a host with"
          r" N GPUs, or a TPU or cpu:N target"):
        topology.hardware_for("h100:4", num_slices=2)
      return
    hardware = topology.hardware_for("h100:4", num_slices=2)
    self.assertLen(hardware.devices, 8)
    self.assertEqual(hardware.device_kind, "NVIDIA H100 80GB HBM3")
    # Two hosts of four GPUs.
    self.assertEqual([d.process_index for d in hardware.devices],
                     [0] * 4 + [1] * 4)
    self.assertEqual(hardware.memory_bytes, int(0.75 * 84_978_434_048))
    self.assertEqual(hardware.peak_flops, 989e12)
    experiment = tiny_experiment.tiny_experiment(scan_layers=False)
    step = compile_step.compile_train_step(experiment, hardware)
    report = compile_step.analyse(step, experiment)
    # The state is split over the 8 GPUs (FSDP): its arguments are about an
    # eighth of the parameters and the Adam moments, in float32.
    params = sum(x.size for x in jax.tree.leaves(
        step.inputs.abstract_state.params))
    self.assertBetween(report.argument_bytes, 3 * 4 * params / 8,
                       1.2 * 3 * 4 * params / 8)
    self.assertIn("all-gather", report.collectives)
    self.assertIn("XLA gives no cost analysis",
                  compile_step.format_report(report, step))


if __name__ == "__main__":
  # The CUDA plugin loads without a GPU only while JAX runs on the CPU.
  jax.config.update("jax_platforms", "cpu")
  absltest.main()
