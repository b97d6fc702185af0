"""Tests of the grouped matmul: megablox (Pallas interpret mode on CPU) and
the tiled one equal ragged_dot, forward and gradients; "auto" compiles to
the Mosaic kernel for a TPU v5e chip and to the tiled one on CPU."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.aot import topology
from maxtext.common import axes
from maxtext.kernels import gmm
from maxtext.sharding import rules
from testing import trees

_M, _K, _N = 200, 128, 256  # M is not a multiple of the 128-row tile.


def _value_and_grads(impl, x, w, sizes, cotangent, tiling=(128, 128, 128)):
  def loss(x, w):
    out = gmm.grouped_matmul(x, w, sizes, impl=impl, interpret=True,
                             tiling=tiling)
    return (out.astype(jnp.float32) * cotangent).sum(), out

  grads, out = jax.grad(loss, argnums=(0, 1), has_aux=True)(x, w)
  return out, grads


class GroupedMatmulTest(parameterized.TestCase):

  def _assert_matches_ragged_dot(self, impl, dtype, sizes,
                                 tiling=(128, 128, 128)):
    """`impl` (jitted) equals ragged_dot on random [M, K] rows in groups of
    `sizes`, forward and gradients; rows past the groups give zeros."""
    rng = np.random.RandomState(0)
    x = rng.normal(size=(_M, _K)).astype(dtype)
    w = (0.1 * rng.normal(size=(len(sizes), _K, _N))).astype(dtype)
    sizes = np.int32(sizes)
    cotangent = rng.normal(size=(_M, _N)).astype(np.float32)
    want, want_grads = _value_and_grads("ragged_dot", x, w, sizes, cotangent)
    got, got_grads = jax.jit(
        lambda *a: _value_and_grads(impl, *a, tiling=tiling))(
            x, w, sizes, cotangent)
    self.assertEqual(got.dtype, dtype)
    # Outputs are O(1) and gradients O(10) (sums over 200 rows). float32:
    # outputs within 1e-5 of their largest magnitude, gradients 1e-4;
    # bfloat16 (rounding at 2**-8 relative): 0.01 absolute and relative
    # (outputs reach ~5, where a unit in the last place is 0.03), and 0.1.
    if dtype == np.float32:
      tol, grad_tol = (dict(rtol=1e-5, scaled_atol=1e-5),
                       dict(rtol=1e-4, scaled_atol=1e-4))
    else:
      tol, grad_tol = dict(rtol=0.01, atol=0.01), dict(rtol=0, atol=0.1)
    trees.assert_close(np.float32(got), np.float32(want), **tol)
    for name, g, w in zip(("dx", "dw"), got_grads, want_grads):
      trees.assert_close(np.float32(g), np.float32(w), **grad_tol,
                         err_msg=name)
    np.testing.assert_array_equal(np.float32(got)[sizes.sum():], 0.0)

  @parameterized.named_parameters(
      # An empty group, and 20 rows past the groups (zeros, no gradient).
      dict(testcase_name="fp32", dtype=np.float32, sizes=(50, 0, 70, 60)),
      dict(testcase_name="bf16", dtype=jnp.bfloat16, sizes=(80, 40, 30, 50)),
  )
  def test_megablox_matches_ragged_dot(self, dtype, sizes):
    self._assert_matches_ragged_dot("megablox", dtype, sizes)

  @parameterized.named_parameters(
      # Tiles of 16 and 7 rows: groups of whole tiles, of part of one, an
      # empty one, and rows past the groups.
      dict(testcase_name="fp32_tile16", dtype=np.float32, tile=16,
           sizes=(32, 5, 0, 90, 17)),
      dict(testcase_name="fp32_tile7_all_rows", dtype=np.float32, tile=7,
           sizes=(1, 99, 0, 0, 100)),
      dict(testcase_name="bf16_tile128", dtype=jnp.bfloat16, tile=128,
           sizes=(80, 40, 30, 50, 0)),
      # 13 rows in groups of 200: the loop stops after two of 17 tiles.
      dict(testcase_name="fp32_tile8_few_rows", dtype=np.float32, tile=8,
           sizes=(0, 9, 4)),
      # One group (an expert-parallel shard's one expert), a tile taller
      # than the rows.
      dict(testcase_name="fp32_one_group_tile512", dtype=np.float32,
           tile=512, sizes=(150,)),
  )
  def test_tiled_matches_ragged_dot(self, dtype, tile, sizes):
    self._assert_matches_ragged_dot("tiled", dtype, sizes,
                                    tiling=(tile, 128, 128))

  @parameterized.named_parameters(
      ("rows_past_groups", (50, 0, 70, 60)),
      # One group runs as a plain matmul (the TPU cannot compile it).
      ("one_group", (150,)))
  def test_ragged_dot_equals_numpy_with_zeros_past_the_groups(self, sizes):
    """The reference itself: each row times its group's matrix in numpy,
    zeros past the groups, and no lhs gradient there (the TPU's ragged_dot
    computes those rows wrong; the wrapper zeroes them everywhere)."""
    rng = np.random.RandomState(1)
    x = rng.normal(size=(_M, _K)).astype(np.float32)
    w = rng.normal(size=(len(sizes), _K, _N)).astype(np.float32)
    cotangent = rng.normal(size=(_M, _N)).astype(np.float32)
    got, (dx, _) = jax.jit(functools.partial(_value_and_grads,
                                             "ragged_dot"))(
                                                 x, w, np.int32(sizes),
                                                 cotangent)
    group_T = np.repeat(np.arange(len(sizes)), sizes)
    rows = len(group_T)
    want = np.zeros((_M, _N), np.float32)
    want[:rows] = np.einsum("td,tdf->tf", x[:rows], w[group_T])
    trees.assert_close(got, want, rtol=1e-5, scaled_atol=1e-5)
    np.testing.assert_array_equal(np.asarray(dx)[rows:], 0.0)

  @parameterized.named_parameters(("three_groups", 3), ("one_group", 1))
  def test_auto_is_tiled_on_cpu(self, groups):
    x, w = np.ones((64, 8), np.float32), np.ones((groups, 8, 4), np.float32)
    sizes = np.int32([10, 0, 30][:groups])
    lowered = {impl: jax.jit(functools.partial(
        gmm.grouped_matmul, impl=impl)).lower(x, w, sizes).as_text()
               for impl in ("auto", "tiled", "ragged_dot")}
    self.assertEqual(lowered["auto"], lowered["tiled"])
    self.assertNotEqual(lowered["auto"], lowered["ragged_dot"])
    self.assertTrue(gmm.skips_unused_rows())

  def test_unknown_impl(self):
    with self.assertRaisesRegex(ValueError, "'cutlass'.*megablox"):
      gmm.grouped_matmul(np.zeros((2, 2)), np.zeros((1, 2, 2)),
                         np.int32([2]), impl="cutlass")

  def test_auto_compiles_to_mosaic_on_tpu(self):
    hardware = topology.hardware_for("v5e-1")
    mesh = jax.sharding.Mesh(np.array(hardware.devices), ("data",))
    sharding = jax.sharding.SingleDeviceSharding(hardware.devices[0])
    x = jax.ShapeDtypeStruct((512, 256), jnp.bfloat16, sharding=sharding)
    w = jax.ShapeDtypeStruct((4, 256, 512), jnp.bfloat16, sharding=sharding)
    sizes = jax.ShapeDtypeStruct((4,), jnp.int32, sharding=sharding)

    def loss(x, w, sizes):
      with axes.activation_sharding(rules.LogicalRules(mesh, (), ())):
        out = gmm.grouped_matmul(x, w, sizes)
      return out.astype(jnp.float32).sum()

    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(
        x, w, sizes).compile()
    # Forward, d lhs (gmm) and d rhs (tgmm).
    self.assertEqual(compiled.as_text().count("custom_call_target=\""
                                              "tpu_custom_call\""), 3)


if __name__ == "__main__":
  absltest.main()
