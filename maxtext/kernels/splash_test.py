"""Tests of the splash attention wrapper: the Pallas kernels in interpret
mode on CPU equal the reference (forward and gradients), and the wrapper
compiles to Mosaic kernels for a TPU v5e chip (libtpu on this host)."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.aot import topology
from maxtext.kernels import attention
from maxtext.kernels import kernel_testing
from maxtext.kernels import splash
from testing import trees

_B, _L, _K = 1, 200, 128  # L pads to 256: two 128-blocks.


class SplashInterpretTest(parameterized.TestCase):

  @parameterized.named_parameters(
      dict(testcase_name="gqa2", num_heads=4, num_kv_heads=2),
      dict(testcase_name="window_segments_softcap_sinks_mqa", num_heads=4,
           num_kv_heads=1, window=50, segments=True, softcap=3.0,
           sinks=True),
  )
  def test_matches_reference(self, num_heads, num_kv_heads, window=None,
                             segments=False, softcap=0.0, sinks=False):
    q, k, v = kernel_testing.inputs(_B, _L, num_heads, num_kv_heads, _K)
    segment_ids = None
    if segments:
      segment_ids = np.repeat(np.int32([[1, 2, 3, 4]]), 50, axis=1)
    sinks_H = (np.linspace(-1.0, 1.0, num_heads).astype(np.float32)
               if sinks else None)
    kwargs = dict(scale=_K**-0.5, window=window, segment_ids_BL=segment_ids,
                  logit_softcap=softcap)
    want, want_grads = kernel_testing.value_and_grads(
        attention.reference_attention, q, k, v, sinks_H, **kwargs)
    got, got_grads = kernel_testing.value_and_grads(
        splash.splash_attention, q, k, v, sinks_H, block_q=128, block_kv=128,
        interpret=True, **kwargs)
    # Outputs within 1e-5 of their largest magnitude; gradients (sums over
    # 200 queries or keys, or all of them for the sinks) within 1e-4.
    trees.assert_close(got, want, rtol=1e-5, scaled_atol=1e-5)
    self.assertLen(got_grads, len(want_grads))
    for name, g, w in zip("qkvs", got_grads, want_grads):
      trees.assert_close(g, w, rtol=1e-4, scaled_atol=1e-4,
                         err_msg=f"d{name}")

  def test_rejects_explicit_mask(self):
    q, k, v = kernel_testing.inputs(_B, _L, 2, 2, _K)
    with self.assertRaisesRegex(ValueError, "mask_BLS.*blockwise"):
      splash.splash_attention(q, k, v, scale=1.0,
                              mask_BLS=np.ones((_B, _L, _L), bool))


class SplashTpuCompileTest(absltest.TestCase):

  def test_fwd_and_bwd_compile_to_mosaic_kernels(self):
    hardware = topology.hardware_for("v5e-1")
    sharding = jax.sharding.SingleDeviceSharding(hardware.devices[0])
    q = jax.ShapeDtypeStruct((1, 1024, 8, 128), jnp.bfloat16,
                             sharding=sharding)
    kv = jax.ShapeDtypeStruct((1, 1024, 2, 128), jnp.bfloat16,
                              sharding=sharding)
    sinks = jax.ShapeDtypeStruct((8,), jnp.float32, sharding=sharding)

    def loss(q, k, v, sinks):
      o = splash.splash_attention(q, k, v, scale=0.1, window=256,
                                  logit_softcap=30.0, sinks_H=sinks,
                                  block_q=256, block_kv=512)
      return o.astype(jnp.float32).sum()

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).lower(
        q, kv, kv, sinks).compile()
    # Forward, dq and dkv kernels.
    self.assertEqual(compiled.as_text().count("custom_call_target=\""
                                              "tpu_custom_call\""), 3)


if __name__ == "__main__":
  absltest.main()
