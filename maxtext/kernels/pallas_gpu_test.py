"""Tests of the Pallas GPU (Triton) flash attention: the kernels in interpret
mode on CPU equal the reference (forward and gradients), the skipped tiles
are exactly the hidden ones, and forward and backward lower to Triton
kernels for CUDA on this CPU host."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.kernels import attention
from maxtext.kernels import kernel_testing
from maxtext.kernels import pallas_gpu
from maxtext.kernels import pallas_gpu_kernels
from testing import trees

_B, _L, _K = 2, 37, 8  # L = 37 pads to 48: three 16-tiles.
# float32: outputs within 1e-5 of their largest magnitude, gradients (sums
# over the queries, the keys, or all of them for the sinks) within 1e-4.
_F32_TOL = dict(rtol=1e-5, scaled_atol=1e-5)
_F32_GRAD_TOL = dict(rtol=1e-4, scaled_atol=1e-4)


class PallasGpuInterpretTest(parameterized.TestCase):

  @parameterized.named_parameters(
      dict(testcase_name="causal_mha", num_heads=2, num_kv_heads=2),
      dict(testcase_name="gqa2_window_segments", num_heads=4, num_kv_heads=2,
           window=9, segments=True),
      dict(testcase_name="gqa4_softcap_sinks_unequal_tiles", num_heads=4,
           num_kv_heads=1, softcap=2.0, sinks=True, block_q=32, block_kv=16),
      dict(testcase_name="mla_head_dims", num_heads=2, num_kv_heads=1,
           window=20, head_dim=12, value_dim=8),
      dict(testcase_name="bf16_every_feature", num_heads=4, num_kv_heads=2,
           window=9, segments=True, softcap=2.0, sinks=True,
           dtype=jnp.bfloat16, tol=dict(rtol=0, atol=2e-2),
           grad_tol=dict(rtol=0, atol=2e-2)),
  )
  def test_matches_reference(self, num_heads, num_kv_heads, window=None,
                             segments=False, softcap=0.0, sinks=False,
                             block_q=16, block_kv=16, head_dim=_K,
                             value_dim=_K, dtype=jnp.float32,
                             tol=None, grad_tol=None):
    q, k, v = kernel_testing.inputs(_B, _L, num_heads, num_kv_heads,
                                    head_dim, value_dim=value_dim,
                                    dtype=dtype)
    segment_ids = None
    if segments:
      segment_ids = np.int32([[1] * 20 + [2] * 17, [1] * 5 + [3] * 32])
    sinks_H = (jnp.linspace(-1.0, 1.0, num_heads, dtype=jnp.float32)
               if sinks else None)
    kwargs = dict(scale=0.3, window=window, segment_ids_BL=segment_ids,
                  logit_softcap=softcap)
    want, want_grads = kernel_testing.value_and_grads(
        attention.reference_attention, q, k, v, sinks_H, **kwargs)
    got, got_grads = kernel_testing.value_and_grads(
        pallas_gpu.pallas_gpu_attention, q, k, v, sinks_H, block_q=block_q,
        block_kv=block_kv, **kwargs)
    self.assertEqual(got.dtype, v.dtype)
    trees.assert_close(np.float32(got), np.float32(want),
                       **(tol or _F32_TOL))
    self.assertLen(got_grads, len(want_grads))
    for name, g, w in zip("qkvs", got_grads, want_grads):
      self.assertEqual(g.shape, w.shape)
      trees.assert_close(np.float32(g), np.float32(w),
                         **(grad_tol or _F32_GRAD_TOL), err_msg=f"d{name}")

  def test_call_without_gradients_matches_reference(self):
    """The primal path (inference) runs the forward kernel alone."""
    q, k, v = kernel_testing.inputs(_B, _L, 4, 2, _K)
    kwargs = dict(scale=0.3, window=9, logit_softcap=2.0,
                  segment_ids_BL=np.int32([[1] * 20 + [2] * 17] * 2),
                  sinks_H=jnp.float32([0.0, 1.0, -1.0, 2.0]))
    want = attention.reference_attention(q, k, v, **kwargs)
    got = jax.jit(lambda q, k, v: pallas_gpu.pallas_gpu_attention(
        q, k, v, block_q=16, block_kv=16, **kwargs))(q, k, v)
    trees.assert_close(got, want, **_F32_TOL)

  @parameterized.parameters((16, 16, None), (32, 16, 9), (16, 32, 20),
                            (16, 16, 1))
  def test_loops_walk_exactly_the_visible_tiles(self, block_q, block_kv,
                                                window):
    """The dynamic loop bounds equal the tiles with a visible pair."""
    st = pallas_gpu._Static(  # pylint: disable=protected-access
        scale=1.0, window=window, logit_softcap=0.0, block_q=block_q,
        block_kv=block_kv, backward_block_q=block_q,
        backward_block_kv=block_kv, interpret=True)
    padded = 128
    i = np.arange(padded)[:, None]
    j = np.arange(padded)[None, :]
    visible = (j <= i) & ((i - j < window) if window else True)
    tiles = visible.reshape(padded // block_q, block_q, padded // block_kv,
                            block_kv).any((1, 3))
    for qi in range(tiles.shape[0]):
      first, end = pallas_gpu_kernels._key_blocks(  # pylint: disable=protected-access
          st, qi * block_q, block_q, block_kv)
      np.testing.assert_array_equal(np.flatnonzero(tiles[qi]),
                                    np.arange(first, end), err_msg=f"q{qi}")
    for kj in range(tiles.shape[1]):
      first, end = pallas_gpu_kernels._query_blocks(  # pylint: disable=protected-access
          st, kj * block_kv, block_q, block_kv, tiles.shape[0])
      np.testing.assert_array_equal(np.flatnonzero(tiles[:, kj]),
                                    np.arange(first, end), err_msg=f"k{kj}")

  @parameterized.parameters(
      (dict(mask_BLS=np.ones((_B, _L, _L), bool)), "mask_BLS.*blockwise"),
      (dict(block_q=24), "block_q=24 must be a power of two"),
      (dict(block_kv=8), "block_kv=8 must be a power of two >= 16"),
  )
  def test_rejects(self, kwargs, message):
    q, k, v = kernel_testing.inputs(_B, _L, 2, 2, _K)
    with self.assertRaisesRegex(ValueError, message):
      pallas_gpu.pallas_gpu_attention(q, k, v, scale=1.0, **kwargs)

  def test_rejects_unequal_lengths(self):
    q, k, v = kernel_testing.inputs(_B, _L, 2, 2, _K)
    with self.assertRaisesRegex(ValueError, "L=37, S=36"):
      pallas_gpu.pallas_gpu_attention(q, k[:, 1:], v[:, 1:], scale=1.0)


class PallasGpuLoweringTest(absltest.TestCase):

  def test_fwd_and_bwd_lower_to_triton_kernels(self):
    """Lowering for CUDA runs the Triton lowering of all three kernels (no
    GPU needed; compiling Triton to PTX would need one)."""
    q = jax.ShapeDtypeStruct((1, 1000, 8, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 1000, 2, 128), jnp.bfloat16)
    sinks = jax.ShapeDtypeStruct((8,), jnp.float32)
    segment_ids = jax.ShapeDtypeStruct((1, 1000), jnp.int32)

    def loss(q, k, v, sinks, segment_ids):
      o = pallas_gpu.pallas_gpu_attention(
          q, k, v, scale=0.1, window=256, logit_softcap=30.0, sinks_H=sinks,
          segment_ids_BL=segment_ids, interpret=False)
      return o.astype(jnp.float32).sum()

    lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).trace(
        q, kv, kv, sinks, segment_ids).lower(lowering_platforms=("cuda",))
    # Forward, dq and dk/dv kernels.
    self.assertEqual(lowered.as_text().count("__gpu$xla.gpu.triton"), 3)


if __name__ == "__main__":
  absltest.main()
