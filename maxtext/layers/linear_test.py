"""Tests of the multi-axis Linear projection."""

import re

from absl.testing import absltest
from flax import nnx
import jax
import numpy as np

from maxtext.layers import linear
from testing import trees


class LinearTest(absltest.TestCase):

  def test_contracts_trailing_input_axes(self):
    layer = linear.Linear((3, 4), (5,), in_axes=("heads", "head_dim"),
                          out_axes=("embed",), dtype="float32",
                          param_dtype="float32", rngs=nnx.Rngs(0))
    x = np.random.RandomState(0).normal(size=(2, 7, 3, 4)).astype(np.float32)
    kernel = np.asarray(layer.kernel[...])
    want = x.reshape(2, 7, 12) @ kernel.reshape(12, 5)
    trees.assert_close(layer(x), want, rtol=1e-5, scaled_atol=1e-5)
    self.assertEqual(layer.kernel.get_metadata()["out_sharding"],
                     ("heads", "head_dim", "embed"))

  def test_gradients_of_batched_input_need_no_transposed_copy(self):
    # [B, L, D] -> [V]: the kernel's gradient contracts B and L of the
    # output gradient. Compiled for CPU it must read that gradient as it is,
    # not copy it transposed to [V, B * L] first (about half the step of a
    # small model's vocabulary projection, before the input was flattened).
    layer = linear.Linear((16,), (96,), in_axes=("embed",),
                          out_axes=("vocab",), dtype="float32",
                          param_dtype="float32", rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(layer)
    rng = np.random.RandomState(0)
    x = rng.normal(size=(4, 8, 16)).astype(np.float32)
    g = rng.normal(size=(4, 8, 96)).astype(np.float32)

    def objective(params, x):
      return (nnx.merge(graphdef, params)(x) * g).sum()

    grad_fn = jax.jit(jax.grad(objective, argnums=(0, 1)))
    hlo = grad_fn.lower(params, x).compile().as_text()
    self.assertEmpty(re.findall(r"= f32\[96,32\]", hlo))
    dparams, dx = grad_fn(params, x)
    kernel = np.asarray(layer.kernel[...])
    trees.assert_close(dparams["kernel"][...],
                       np.einsum("bld,blv->dv", x, g), rtol=1e-5,
                       scaled_atol=1e-5)
    trees.assert_close(dx, g @ kernel.T, rtol=1e-5, scaled_atol=1e-5)

  def test_init_scale_follows_fan_in(self):
    layer = linear.Linear((256,), (8, 64), in_axes=("embed",),
                          out_axes=("heads", "head_dim"), dtype="float32",
                          param_dtype="float32", rngs=nnx.Rngs(0))
    std = float(np.std(np.asarray(layer.kernel[...])))
    self.assertAlmostEqual(std, 256**-0.5, delta=0.1 * 256**-0.5)

  def test_bias_is_added_and_named_by_output_axes(self):
    layer = linear.Linear((4,), (3, 2), in_axes=("embed",),
                          out_axes=("heads", "head_dim"), dtype="float32",
                          param_dtype="float32", rngs=nnx.Rngs(0),
                          use_bias=True)
    np.testing.assert_array_equal(layer.bias[...], np.zeros((3, 2)))
    layer.bias[...] = np.arange(6, dtype=np.float32).reshape(3, 2)
    x = np.random.RandomState(0).normal(size=(2, 4)).astype(np.float32)
    kernel = np.asarray(layer.kernel[...])
    want = np.einsum("bd,dhk->bhk", x, kernel) + layer.bias[...]
    trees.assert_close(layer(x), want, rtol=1e-5, scaled_atol=1e-5)
    self.assertEqual(layer.bias.get_metadata()["out_sharding"],
                     ("heads", "head_dim"))

  def test_no_bias_by_default(self):
    layer = linear.Linear((4,), (3,), in_axes=("embed",), out_axes=("mlp",),
                          dtype="float32", param_dtype="float32",
                          rngs=nnx.Rngs(0))
    self.assertIsNone(layer.bias)

  def test_axis_names_must_match_shape(self):
    with self.assertRaisesRegex(ValueError, "do not match"):
      linear.Linear((3,), (5,), in_axes=("embed",), out_axes=("mlp", "x"),
                    dtype="float32", param_dtype="float32", rngs=nnx.Rngs(0))


if __name__ == "__main__":
  absltest.main()
