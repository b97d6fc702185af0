"""Tests of the gated MLP."""

import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import numpy as np

from maxtext.common.model_config import ModelConfig
from maxtext.layers import mlp


def _silu(x):
  return x / (1 + np.exp(-x))


def _gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) *
                                (x + 0.044715 * x**3)))


class MLPTest(parameterized.TestCase):

  @parameterized.parameters(("silu", _silu), ("gelu_tanh", _gelu_tanh))
  def test_matches_formula(self, activation, formula):
    cfg = ModelConfig(family="test", vocab_size=8, num_layers=1, embed_dim=6,
                      mlp_dim=10, num_heads=1, num_kv_heads=1, head_dim=2,
                      mlp_activation=activation)
    layer = mlp.MLP(cfg, rngs=nnx.Rngs(0))
    x = np.random.RandomState(0).normal(size=(2, 3, 6)).astype(np.float32)
    gate, up, down = (np.asarray(p.kernel[...])
                      for p in (layer.gate, layer.up, layer.down))
    want = (formula(x @ gate) * (x @ up)) @ down
    np.testing.assert_allclose(layer(x), want, rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
  absltest.main()
