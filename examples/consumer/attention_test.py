"""A consumer's test of maxtext's attention layer against numpy."""

from absl.testing import absltest
from flax import nnx
import jax.numpy as jnp
import numpy as np

from maxtext.layers import attention
from maxtext.layers import norm


def _numpy_attention(layer, x_BLD):
  """Causal grouped-query softmax attention with `layer`'s weights, no
  rotary (position-free), scaled by 1/sqrt(head_dim)."""
  wq, wk, wv, wo = (np.asarray(p.kernel[...]) for p in (
      layer.query, layer.key, layer.value, layer.output))
  q = np.einsum("bld,dhk->blhk", x_BLD, wq)
  k = np.einsum("bld,dgk->blgk", x_BLD, wk)
  v = np.einsum("bld,dgk->blgk", x_BLD, wv)
  group = q.shape[2] // k.shape[2]
  k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
  scores = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(q.shape[-1])
  length = x_BLD.shape[1]
  scores = np.where(np.tril(np.ones((length, length), bool)), scores, -np.inf)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  return np.einsum("bhqs,bshk,hkd->bqd", probs, v, wo)


class AttentionTest(absltest.TestCase):

  def test_matches_numpy(self):
    layer = attention.Attention(
        attention.AttentionConfig(num_heads=4, num_kv_heads=2, head_dim=8),
        embed_dim=16, norm_config=norm.NormConfig(), dtype="float32",
        param_dtype="float32", rngs=nnx.Rngs(0))
    x = np.random.default_rng(0).normal(size=(2, 10, 16)).astype(np.float32)
    got = np.asarray(layer(jnp.asarray(x), None))
    np.testing.assert_allclose(got, _numpy_attention(layer, x), rtol=1e-4,
                               atol=1e-5)


if __name__ == "__main__":
  absltest.main()
