"""Tests of maxtext.aot.compile_step: TPU compiles on this CPU host, the
out-of-memory error, and the CPU step against `pretrain.prepare`'s.

Needs 8 CPU devices (JAX_NUM_CPU_DEVICES=8) and
libtpu.
"""

import dataclasses
import math

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from configs import llama3
from maxtext.aot import aot_testing
from maxtext.aot import compile_step
from maxtext.aot import tiny_experiment
from maxtext.kernels import dispatch
from maxtext.metrics import flops
from maxtext.trainers import pretrain
from maxtext.trainers import train_state as train_state_lib
from maxtext.trainers.config import ExperimentConfig
from testing import devices


def _device_bytes(tree) -> int:
  """Bytes one device holds of a tree of sharded specs (no padding)."""
  return sum(
      math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
      for leaf in jax.tree.leaves(tree))


class TpuCompileTest(absltest.TestCase):

  def test_fsdp_step_on_v5e_2x2(self):
    experiment = tiny_experiment.tiny_experiment(num_layers=3)
    # Plain-XLA attention: XLA's bytes-accessed count of the splash kernel
    # (`auto` on TPU) inside its shard_map is not additive over layers (1.3%
    # off), which the extrapolation check below would flag.
    experiment = dataclasses.replace(
        experiment, attention_kernel=dispatch.Kernel(impl="reference"))
    step, report = aot_testing.compile_for(experiment, "v5e:2x2")
    self.assertEqual(step.hardware.device_kind, "TPU v5 lite")
    self.assertEqual(dict(step.mesh.shape)["fsdp"], 4)
    # The donated state is reused for the new state; TPU tiles pad arrays,
    # so each device holds at least its unpadded shards.
    state_bytes = _device_bytes(step.inputs.abstract_state)
    batch_bytes = _device_bytes(step.inputs.batch_specs)
    self.assertGreaterEqual(report.argument_bytes, state_bytes + batch_bytes)
    self.assertGreaterEqual(report.alias_bytes, state_bytes)
    self.assertEqual(report.memory_bytes, int(15.75 * 2**30))
    self.assertTrue(report.fits)
    # FSDP gathers the parameters and reduces the gradients.
    self.assertIn("all-gather", report.collectives)
    self.assertTrue({"all-reduce", "reduce-scatter"} & set(report.collectives))
    # XLA's cost of the scanned layers, extrapolated from 1 and 2 unrolled
    # ones, is that of 3 unrolled layers.
    unrolled = compile_step.compile_train_step(
        dataclasses.replace(
            experiment, model=experiment.model.replace(scan_layers=False)),
        step.hardware)
    cost = unrolled.compiled.cost_analysis()
    self.assertAlmostEqual(report.xla_flops / cost["flops"], 1.0, places=4)
    self.assertAlmostEqual(report.bytes_accessed / cost["bytes accessed"], 1.0,
                           places=2)
    # XLA counts what our formula counts, plus norms, softmax and the
    # optimizer: a little more.
    self.assertBetween(report.xla_flops / report.model_flops, 1.0, 1.3)
    self.assertGreater(report.step_time_s, 0)
    text = compile_step.format_report(report, step)
    self.assertIn(f"{report.total_bytes:,}", text)
    self.assertIn("fits:", text)

  def test_one_chip_has_no_collectives(self):
    _, report = aot_testing.compile_for(
        tiny_experiment.tiny_experiment(num_layers=1), "v5e-1")
    self.assertEqual(report.collectives, {})

  def test_llama3_8b_layers_do_not_fit_one_v5e_chip(self):
    # Two layers of Llama 3 8B with its 128k vocabulary: 1.5B parameters,
    # 24 GB of float32 parameters, gradients and Adam moments > 15.75 GiB.
    config = llama3.get_config("8b")
    config.model.num_layers = 2
    config.data.source = "synthetic"
    config.mesh.ici.update(data=1, fsdp=-1)
    experiment = ExperimentConfig.from_config_dict(config)
    with self.assertRaisesRegex(
        compile_step.DoesNotFitError,
        r"does not fit in the 15\.75 GiB of v5e HBM per device on v5e-1:"
        r".*RESOURCE_EXHAUSTED.*remat.policy"):
      aot_testing.compile_for(experiment, "v5e-1")


class CpuCompileTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    devices.require_devices(8)

  def test_step_equals_prepared_step(self):
    experiment = tiny_experiment.tiny_experiment(
        dict(data=1, fsdp=4, tensor=2))
    prepared = pretrain.prepare(experiment)
    batch = next(prepared.batches)
    step, report = aot_testing.compile_for(experiment, "cpu:8")
    self.assertEqual(prepared.mesh.devices.tolist(),
                     step.mesh.devices.tolist())
    # On CPU arrays are not padded: the arguments are exactly the state's
    # and the batch's shards.
    self.assertEqual(report.argument_bytes,
                     _device_bytes(step.inputs.abstract_state) +
                     _device_bytes(step.inputs.batch_specs))
    tokens = experiment.train.batch_size * experiment.data.seq_len
    self.assertAlmostEqual(
        report.model_flops * 8,
        flops.training_flops_per_token(experiment.model,
                                       experiment.data.seq_len) * tokens)
    # The compiled step takes states built with its own optimizer (a static
    # part of the state); initialised from the same seed they are equal.
    state = train_state_lib.create_train_state(experiment.model,
                                               **step.inputs.state_args)
    jax.tree.map(np.testing.assert_array_equal, state.params,
                 prepared.state.params)
    got_state, got_metrics = step.compiled(state, batch)
    want_state, want_metrics = prepared.step_fn(prepared.state, batch)
    self.assertEqual(got_metrics.keys(), want_metrics.keys())
    for key in want_metrics:
      np.testing.assert_array_equal(got_metrics[key], want_metrics[key],
                                    err_msg=key)
    jax.tree.map(np.testing.assert_array_equal,
                 got_state.checkpoint_tree(), want_state.checkpoint_tree())

  def test_mixed_layer_costs_extrapolate_to_the_unrolled_model(self):
    # A dense first layer, then expert layers alternating local and global
    # attention: the pattern repeats every 2 layers after the first, so
    # 6 layers cost cost(2) + 2 * (cost(4) - cost(2)).
    experiment = tiny_experiment.tiny_experiment(
        num_layers=6, num_experts=4, num_experts_per_token=2, moe_mlp_dim=32,
        first_dense_layers=1, sliding_window=8, global_layer_interval=2)
    step, report = aot_testing.compile_for(experiment, "cpu:8")
    self.assertEqual(
        report.cost_source,
        "XLA cost analysis of 2 and 4 unrolled layers, extrapolated")
    unrolled = compile_step.compile_train_step(
        dataclasses.replace(
            experiment, model=experiment.model.replace(scan_layers=False)),
        step.hardware).compiled.cost_analysis()
    self.assertAlmostEqual(report.xla_flops / unrolled["flops"], 1.0,
                           places=4)
    self.assertAlmostEqual(report.bytes_accessed / unrolled["bytes accessed"],
                           1.0, places=2)

  def test_check_fits_names_the_shortfall(self):
    _, report = aot_testing.compile_for(
        tiny_experiment.tiny_experiment(num_layers=1), "cpu:8")
    self.assertTrue(report.fits)
    compile_step.check_fits(report, "cpu:8")
    small = dataclasses.replace(report, memory_bytes=report.total_bytes // 2)
    short = report.total_bytes - small.memory_bytes
    with self.assertRaisesRegex(
        compile_step.DoesNotFitError,
        rf"needs {report.total_bytes / 2**30:.2f} GiB per device on cpu:8,"
        rf" {short / 2**30:.2f} GiB more than"):
      compile_step.check_fits(small, "cpu:8")

  def test_collectives_are_counted_from_the_program_text(self):
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("x",))
    sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))

    @jax.jit
    def total(x):
      return jnp.sum(x)

    x = jax.device_put(jnp.arange(64.0), sharded)
    text = total.lower(x).compile().as_text()
    self.assertEqual(compile_step.collective_counts(text), {"all-reduce": 1})
    self.assertEqual(compile_step.collective_counts(
        jax.jit(jnp.sin).lower(x).compile().as_text()), {})


if __name__ == "__main__":
  absltest.main()
