"""cuDNN attention in the train step compiled for compile-only H100s
(`//maxtext/aot:cuda_plugin_cudnn`: jax's CUDA plugin and cuDNN's library,
which JAX asks for its version when it traces cuDNN attention; XLA's compile
itself needs no cuDNN). The compiled HLO must call cuDNN's fused attention,
forward and backward, once per layer, on each device's shard of the batch.

Needs JAX on the CPU platform (set below). A manual target: cuDNN's wheel is
716 MB.
"""

import collections
import re

from absl.testing import absltest
from absl.testing import parameterized
import jax

from maxtext.aot import compile_step
from maxtext.aot import tiny_experiment
from maxtext.aot import topology

_CUSTOM_CALL_RE = re.compile(r'custom_call_target="([^"]+)"')


class GpuCudnnCompileTest(parameterized.TestCase):

  @parameterized.parameters(
      # "auto" takes cuDNN on GPU for bfloat16 without segment ids (the
      # synthetic data has none), as on a real GPU.
      ("cudnn", 1),
      ("auto", 1),
      # Plain JAX: the control, no cuDNN call.
      ("reference", 0),
  )
  def test_fused_attention_in_bf16_train_step(self, impl, calls_per_layer):
    experiment = tiny_experiment.tiny_experiment(
        scan_layers=False, dtype="bfloat16", attention_impl=impl)
    hardware = topology.hardware_for("h100:8")
    step = compile_step.compile_train_step(experiment, hardware)
    hlo = step.compiled.as_text()
    targets = collections.Counter(_CUSTOM_CALL_RE.findall(hlo))
    layers = experiment.model.num_layers
    self.assertEqual(targets["__cudnn$fmhaSoftmax"], calls_per_layer * layers,
                     targets)
    self.assertEqual(targets["__cudnn$fmhaSoftmaxBackward"],
                     calls_per_layer * layers, targets)
    # Each call takes one device's queries: its eighth of the batch (FSDP),
    # every position and head, [B, L, H, K].
    model = experiment.model
    shard = ",".join(map(str, (experiment.train.batch_size // 8,
                               experiment.data.seq_len,
                               model.attention.num_heads,
                               model.attention.head_dim)))
    for line in hlo.splitlines():
      if 'custom_call_target="__cudnn$fmhaSoftmax"' in line:
        self.assertIn(f"operand_layout_constraints={{bf16[{shard}]", line)
    report = compile_step.analyse(step, experiment)
    self.assertTrue(report.fits)


if __name__ == "__main__":
  # The CUDA plugin loads without a GPU only while JAX runs on the CPU.
  jax.config.update("jax_platforms", "cpu")
  absltest.main()
