"""Attention that `auto` sends to the Pallas GPU kernels, compiled for an
H100 on this CPU-only host: compile-only devices from jax's CUDA PJRT plugin
(`//maxtext/aot:cuda_plugin`), so XLA runs the Triton pipeline down to the
GPU's limits (shared memory per block, which rejects tiles too large for the
head-dim rows). Needs JAX on the CPU platform (set below), which the plugin
needs to load without a GPU.
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.aot import topology
from maxtext.common import axes
from maxtext.kernels import dispatch
from maxtext.sharding import rules


class PallasGpuCompileTest(parameterized.TestCase):

  @parameterized.named_parameters(
      dict(testcase_name="bf16_gqa_every_feature", dtype=jnp.bfloat16,
           head_dim=128, features=True),
      # float32 rows are twice as wide: at the bfloat16 tiles the forward
      # asks for more shared memory than an H100 block has.
      dict(testcase_name="f32_causal", dtype=jnp.float32, head_dim=128,
           features=False),
  )
  def test_fwd_and_bwd_compile_for_h100(self, dtype, head_dim, features):
    hardware = topology.hardware_for("h100:1")
    mesh = jax.sharding.Mesh(np.array(hardware.devices), ("data",))
    sharding = jax.sharding.SingleDeviceSharding(hardware.devices[0])

    def shape(*dims, dtype=dtype):
      return jax.ShapeDtypeStruct(dims, dtype, sharding=sharding)

    def loss(q, k, v, sinks, segment_ids):
      o = dispatch.attention(
          q, k, v, impl="auto", scale=0.1, window=256 if features else None,
          logit_softcap=30.0 if features else 0.0,
          sinks_H=sinks if features else None,
          segment_ids_BL=segment_ids if features else None, block_q=512,
          block_kv=512)
      return o.astype(jnp.float32).sum()

    # The activation mesh makes the target a GPU: "auto" takes pallas_gpu
    # (cuDNN serves neither soft-cap nor float32), compiled, not interpreted.
    with axes.activation_sharding(rules.LogicalRules(mesh, (), ())):
      compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).lower(
          shape(2, 1000, 8, head_dim), shape(2, 1000, 2, head_dim),
          shape(2, 1000, 2, head_dim), shape(8, dtype=jnp.float32),
          shape(2, 1000, dtype=jnp.int32)).compile()
    # Forward, dq and dk/dv kernels.
    self.assertEqual(compiled.as_text().count("__gpu$xla.gpu.triton"), 3)


if __name__ == "__main__":
  # The CUDA plugin loads without a GPU only while JAX runs on the CPU.
  jax.config.update("jax_platforms", "cpu")
  absltest.main()
