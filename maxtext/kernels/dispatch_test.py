"""Tests of the attention dispatcher: "auto" per platform and feature set,
clear errors, and every CPU implementation equal to the reference."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.aot import topology
from maxtext.common import axes
from maxtext.kernels import attention
from maxtext.kernels import backend
from maxtext.kernels import dispatch
from maxtext.sharding import rules
from testing import trees


def _inputs(dtype=np.float32):
  rng = np.random.RandomState(0)
  q = rng.normal(size=(2, 19, 4, 8)).astype(dtype)
  k = rng.normal(size=(2, 19, 2, 8)).astype(dtype)
  v = rng.normal(size=(2, 19, 2, 8)).astype(dtype)
  return q, k, v


class SelectTest(parameterized.TestCase):

  @parameterized.parameters(
      ("cpu", (), jnp.float32, "blockwise"),
      ("cpu", ("mask_BLS",), jnp.float32, "blockwise"),
      ("cpu", ("mask_BLS",), jnp.float32, "reference", True),
      ("cpu", ("sinks_H",), jnp.float32, "reference", True),
      ("tpu", (), jnp.float32, "splash", True),
      ("tpu", ("window", "logit_softcap", "sinks_H"), jnp.bfloat16, "splash"),
      ("tpu", ("mask_BLS",), jnp.bfloat16, "reference"),
      ("gpu", ("window",), jnp.bfloat16, "cudnn"),
      ("gpu", ("logit_softcap",), jnp.bfloat16, "pallas_gpu"),
      ("gpu", ("logit_softcap",), jnp.bfloat16, "pallas_gpu", True),
      ("gpu", ("sinks_H", "window"), jnp.bfloat16, "pallas_gpu"),
      ("gpu", ("segment_ids_BL",), jnp.bfloat16, "pallas_gpu"),
      ("gpu", (), jnp.float32, "pallas_gpu"),
      ("gpu", ("mask_BLS",), jnp.bfloat16, "reference"),
      # Without cuDNN's library (a compile-only GPU target).
      ("gpu", ("window",), jnp.bfloat16, "pallas_gpu", False, False),
  )
  def test_auto(self, platform, features, dtype, want, one_tile=False,
                cudnn=True):
    self.assertEqual(
        dispatch.select_impl("auto", features=features, platform=platform,
                             dtype=dtype, one_tile=one_tile, cudnn=cudnn),
        want)

  @parameterized.parameters(
      ("xla", ("logit_softcap",), "cpu", "does not support logit_softcap"),
      ("cudnn", (), "cpu", "runs only on"),
      ("cudnn", ("segment_ids_BL",), "gpu", "does not support segment_ids"),
      ("splash", ("mask_BLS",), "tpu", "does not support mask_BLS"),
      ("pallas_gpu", (), "cpu", "runs only on"),
      ("pallas_gpu", ("mask_BLS",), "gpu", "does not support mask_BLS"),
      ("flash", (), "cpu", "Unknown attention impl 'flash'"),
  )
  def test_impl_that_cannot_serve_the_call(self, impl, features, platform,
                                           message):
    with self.assertRaisesRegex(ValueError, message) as raised:
      dispatch.select_impl(impl, features=features, platform=platform,
                           dtype=jnp.bfloat16)
    self.assertIn("auto", str(raised.exception))

  def test_error_names_the_valid_impls(self):
    with self.assertRaisesRegex(
        ValueError, r"Valid here: \['auto', 'reference', 'blockwise'\]"):
      dispatch.select_impl("xla", features=("sinks_H",), platform="cpu",
                           dtype=jnp.float32)

  def test_platform_comes_from_the_activation_mesh(self):
    self.assertEqual(backend.target_platform(), "cpu")
    hardware = topology.hardware_for("v5e-1")
    mesh = jax.sharding.Mesh(np.array(hardware.devices), ("data",))
    with axes.activation_sharding(rules.LogicalRules(mesh, (), ())):
      self.assertEqual(backend.target_platform(), "tpu")


class AttentionTest(parameterized.TestCase):

  @parameterized.parameters("auto", "reference", "blockwise", "xla")
  def test_matches_reference(self, impl):
    q, k, v = _inputs()
    segment_ids = np.int32([[1] * 10 + [2] * 9, [1] * 19])
    want = attention.reference_attention(q, k, v, scale=0.3, window=7,
                                         segment_ids_BL=segment_ids)
    got = dispatch.attention(q, k, v, impl=impl, scale=0.3, window=7,
                             segment_ids_BL=segment_ids, block_q=8,
                             block_kv=8)
    trees.assert_close(got, want, rtol=1e-5, scaled_atol=1e-5)

  def test_auto_on_cpu_serves_every_feature(self):
    q, k, v = _inputs()
    sinks_H = np.float32([0.0, 1.0, -1.0, 2.0])
    want = attention.reference_attention(q, k, v, scale=0.3,
                                         logit_softcap=2.0, sinks_H=sinks_H)
    got = dispatch.Kernel(block_q=8, block_kv=8)(
        q, k, v, scale=0.3, logit_softcap=2.0, sinks_H=sinks_H)
    trees.assert_close(got, want, rtol=1e-5, scaled_atol=1e-5)

  def test_kernels_of_one_config_are_equal(self):
    """Static structure of models built twice must match (jit caches)."""
    self.assertEqual(dispatch.Kernel(block_q=8),
                     dispatch.Kernel(block_q=8))
    self.assertNotEqual(dispatch.Kernel(block_q=8),
                        dispatch.Kernel(block_q=16))

  def test_kernel_rejects_unknown_impl(self):
    with self.assertRaisesRegex(
        ValueError, r"attention_kernel.impl='pallas' is invalid; valid"):
      dispatch.Kernel(impl="pallas")
    with self.assertRaisesRegex(ValueError, r"attention_kernel.block_q=0"):
      dispatch.Kernel(block_q=0)


if __name__ == "__main__":
  absltest.main()
