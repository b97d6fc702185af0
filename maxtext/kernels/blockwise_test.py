"""Tests of blockwise attention: equals the reference (forward and gradients)
and its compiled training step needs no L x L buffer."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.kernels import attention
from maxtext.kernels import blockwise
from maxtext.kernels import kernel_testing
from testing import trees

_B, _L, _K = 2, 37, 8  # L is not a multiple of the blocks below.
_BLOCKS = dict(block_q=8, block_kv=16)


_CASES = [
    dict(testcase_name="mha", num_heads=4, num_kv_heads=4),
    dict(testcase_name="gqa2", num_heads=4, num_kv_heads=2),
    dict(testcase_name="gqa4_mqa", num_heads=4, num_kv_heads=1),
    dict(testcase_name="window", num_heads=4, num_kv_heads=2, window=5),
    dict(testcase_name="window_wider_than_block", num_heads=4,
         num_kv_heads=1, window=20),
    dict(testcase_name="segments", num_heads=4, num_kv_heads=2,
         segments=True),
    dict(testcase_name="softcap", num_heads=4, num_kv_heads=2, softcap=2.0),
    dict(testcase_name="sinks", num_heads=4, num_kv_heads=2, sinks=True),
    dict(testcase_name="all", num_heads=4, num_kv_heads=1, window=9,
         segments=True, softcap=3.0, sinks=True),
]


class BlockwiseTest(parameterized.TestCase):

  @parameterized.named_parameters(*_CASES)
  def test_matches_reference_fp32(self, num_heads, num_kv_heads, window=None,
                                  segments=False, softcap=0.0, sinks=False):
    q, k, v = kernel_testing.inputs(_B, _L, num_heads, num_kv_heads, _K)
    sinks_H = (np.linspace(-1.0, 2.0, num_heads).astype(np.float32)
               if sinks else None)
    kwargs = dict(
        scale=0.4, window=window, logit_softcap=softcap,
        segment_ids_BL=kernel_testing.segments(_B, _L) if segments else None)
    want, want_grads = kernel_testing.value_and_grads(
        attention.reference_attention, q, k, v, sinks_H, **kwargs)
    got, got_grads = kernel_testing.value_and_grads(
        blockwise.blockwise_attention, q, k, v, sinks_H, **kwargs,
        **_BLOCKS)
    # Outputs within 1e-5 of their largest magnitude; gradients (sums over
    # the queries, the keys, or all of them for the sinks) within 1e-4.
    trees.assert_close(got, want, rtol=1e-5, scaled_atol=1e-5)
    self.assertLen(got_grads, len(want_grads))
    for name, g, w in zip("qkvs", got_grads, want_grads):
      trees.assert_close(g, w, rtol=1e-4, scaled_atol=1e-4,
                         err_msg=f"d{name}")

  def test_matches_reference_bf16(self):
    q, k, v = kernel_testing.inputs(_B, _L, 4, 2, _K, dtype=jnp.bfloat16)
    kwargs = dict(scale=0.4, window=11,
                  segment_ids_BL=kernel_testing.segments(_B, _L))
    want, want_grads = kernel_testing.value_and_grads(
        attention.reference_attention, q, k, v, None, **kwargs)
    got, got_grads = kernel_testing.value_and_grads(
        blockwise.blockwise_attention, q, k, v, None, **kwargs, **_BLOCKS)
    self.assertEqual(got.dtype, jnp.bfloat16)
    # bf16 rounds at 2**-8 relative; outputs and grads are O(1), outputs up
    # to ~3 (where a unit in the last place is 1.6e-2).
    np.testing.assert_allclose(np.float32(got), np.float32(want), rtol=1e-2,
                               atol=2e-2)
    for name, g, w in zip("qkv", got_grads, want_grads):
      np.testing.assert_allclose(np.float32(g), np.float32(w), atol=5e-2,
                                 err_msg=f"d{name}")

  def test_value_dim_differs_from_key_dim(self):
    q, k, v = kernel_testing.inputs(_B, _L, 4, 4, _K, value_dim=12)
    want, want_grads = kernel_testing.value_and_grads(
        attention.reference_attention, q, k, v, None, scale=0.3)
    got, got_grads = kernel_testing.value_and_grads(
        blockwise.blockwise_attention, q, k, v, None, scale=0.3, **_BLOCKS)
    trees.assert_close(got, want, rtol=1e-5, scaled_atol=1e-5)
    for g, w in zip(got_grads, want_grads):
      trees.assert_close(g, w, rtol=1e-4, scaled_atol=1e-4)

  def test_explicit_mask_over_kv_cache(self):
    """Decoding: two queries per row at given positions over a 37-slot
    cache (keys past the positions are garbage the mask must hide)."""
    q, k, v = kernel_testing.inputs(_B, _L, 4, 2, _K)
    q = q[:, :2]
    mask_BLS = attention.positions_mask(np.array([[3, 4], [30, 31]]), _L,
                                        window=6)
    sinks_H = np.float32([0.5, -1.0, 0.0, 1.0])
    want, want_grads = kernel_testing.value_and_grads(
        attention.reference_attention, q, k, v, sinks_H, scale=0.4,
        mask_BLS=mask_BLS)
    got, got_grads = kernel_testing.value_and_grads(
        blockwise.blockwise_attention, q, k, v, sinks_H, scale=0.4,
        mask_BLS=mask_BLS, block_kv=8)
    trees.assert_close(got, want, rtol=1e-5, scaled_atol=1e-5)
    for g, w in zip(got_grads, want_grads):
      trees.assert_close(g, w, rtol=1e-4, scaled_atol=1e-4)

  def test_bad_block_size(self):
    q, k, v = kernel_testing.inputs(_B, _L, 2, 2, _K)
    with self.assertRaisesRegex(ValueError, "block_kv=0"):
      blockwise.blockwise_attention(q, k, v, scale=1.0, block_kv=0)

  def test_training_step_memory_stays_below_one_score_matrix(self):
    """L=4096: the compiled fwd+bwd of blockwise needs less scratch than one
    float32 L x L x H score matrix; the reference needs more."""
    length, num_heads, num_kv_heads, head_dim = 4096, 4, 2, 32
    q = jax.ShapeDtypeStruct((1, length, num_heads, head_dim), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, length, num_kv_heads, head_dim),
                              jnp.float32)

    def temp_bytes(fn):
      def loss(q, k, v):
        return fn(q, k, v, scale=head_dim**-0.5).sum()
      compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(
          q, kv, kv).compile()
      return compiled.memory_analysis().temp_size_in_bytes

    bound = length * length * num_heads * 4
    reference = temp_bytes(attention.reference_attention)
    flash = temp_bytes(blockwise.blockwise_attention)
    self.assertGreater(reference, bound)
    self.assertLess(flash, bound)


if __name__ == "__main__":
  absltest.main()
