"""The default config's train step, compiled ahead of time for small TPU
topologies on this CPU host (libtpu), runs the Pallas kernels that
attention_kernel.impl="auto" and the MoE grouped matmul pick there."""

from absl.testing import absltest
from absl.testing import parameterized

from maxtext.aot import compile_step
from maxtext.aot import tiny_experiment
from maxtext.aot import topology

_MOSAIC = "custom_call_target=\"tpu_custom_call\""


def _compiled_text(topology_name, **model):
  experiment = tiny_experiment.tiny_experiment(num_layers=2, **model)
  hardware = topology.hardware_for(topology_name)
  return experiment, compile_step.compile_train_step(
      experiment, hardware).compiled.as_text()


class TpuTrainStepTest(parameterized.TestCase):

  def test_auto_attention_is_splash_under_fsdp(self):
    """Four chips, FSDP: splash runs per shard in a shard_map."""
    experiment, text = _compiled_text("v5e:2x2")
    self.assertEqual(experiment.attention_kernel.impl, "auto")
    # The scanned layers' body holds the forward, dq and dkv kernels.
    self.assertEqual(text.count(_MOSAIC), 3)

  def test_moe_on_one_chip_uses_megablox(self):
    _, text = _compiled_text("v5e-1", num_experts=4, num_experts_per_token=2,
                             moe_mlp_dim=128, embed_dim=128, head_dim=32)
    # Splash (3) and megablox for gate, up and down: forward, d lhs and
    # d rhs each (9).
    self.assertEqual(text.count(_MOSAIC), 12)


if __name__ == "__main__":
  absltest.main()
