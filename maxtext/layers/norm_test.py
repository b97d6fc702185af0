"""Tests of RMSNorm."""

from absl.testing import absltest
from absl.testing import parameterized
import jax.numpy as jnp
import numpy as np

from maxtext.layers import norm


class RMSNormTest(parameterized.TestCase):

  @parameterized.parameters(0.0, 1.0)
  def test_starts_as_plain_normalisation(self, offset):
    layer = norm.RMSNorm(6, axis_name="embed", eps=1e-6, offset=offset,
                         param_dtype="float32")
    x = np.random.RandomState(0).normal(size=(2, 3, 6)).astype(np.float32)
    want = x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(layer(x), want, rtol=1e-5)

  @parameterized.parameters(0.0, 1.0)
  def test_multiplies_by_offset_plus_scale(self, offset):
    layer = norm.RMSNorm(4, axis_name="embed", eps=0.5, offset=offset,
                         param_dtype="float32")
    layer.scale[...] = jnp.array([0.5, 1.0, 2.0, -1.0])
    x = np.array([[1.0, -2.0, 3.0, 0.5]], np.float32)
    rms = np.sqrt(np.mean(x**2) + 0.5)
    want = x / rms * (offset + np.array([0.5, 1.0, 2.0, -1.0]))
    np.testing.assert_allclose(layer(x), want, rtol=1e-6)

  def test_keeps_input_dtype_and_names_axis(self):
    layer = norm.RMSNorm(4, axis_name="head_dim", eps=1e-6, offset=0.0,
                         param_dtype="float32")
    self.assertEqual(layer(jnp.ones((2, 4), jnp.bfloat16)).dtype, jnp.bfloat16)
    self.assertEqual(layer.scale.get_metadata()["out_sharding"], ("head_dim",))


if __name__ == "__main__":
  absltest.main()
