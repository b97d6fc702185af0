"""Tests of the token embedding and its tied output head."""

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import numpy as np

from maxtext.layers import embedding
from testing import trees


class EmbedderTest(parameterized.TestCase):

  @parameterized.parameters(False, True)
  def test_lookup_and_scale(self, scale):
    layer = embedding.Embedder(10, 16, scale_by_sqrt_dim=scale,
                               dtype="float32", param_dtype="float32",
                               rngs=nnx.Rngs(0))
    tokens = np.array([[3, 0, 9]])
    table = np.asarray(layer.embedding[...])
    want = table[tokens] * (4.0 if scale else 1.0)
    np.testing.assert_allclose(layer(tokens), want, rtol=1e-6)

  def test_attend_is_the_transposed_table(self):
    layer = embedding.Embedder(10, 16, scale_by_sqrt_dim=True,
                               dtype="float32", param_dtype="float32",
                               rngs=nnx.Rngs(0))
    x = np.random.RandomState(0).normal(size=(2, 3, 16)).astype(np.float32)
    want = x @ np.asarray(layer.embedding[...]).T
    trees.assert_close(layer.attend(x), want, rtol=1e-5, scaled_atol=1e-5)
    self.assertEqual(layer.embedding.get_metadata()["out_sharding"],
                     ("vocab", "embed"))


if __name__ == "__main__":
  absltest.main()
