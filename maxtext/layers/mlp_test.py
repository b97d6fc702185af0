"""Tests of the gated MLP."""

import math

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import numpy as np

from maxtext.layers import mlp
from testing import trees


def _silu(x):
  return x / (1 + np.exp(-x))


def _gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) *
                                (x + 0.044715 * x**3)))


def _clamped_swiglu(gate, up):
  """GPT-OSS's unit as transformers' GptOssExperts._apply_gate writes it."""
  gate = np.minimum(gate, 7.0)
  up = np.clip(up, -7.0, 7.0)
  return (up + 1) * gate / (1 + np.exp(-1.702 * gate))


def _mlp(activation: str) -> mlp.MLP:
  return mlp.MLP(mlp.MlpConfig(dim=10, activation=activation), embed_dim=6,
                 dtype="float32", param_dtype="float32", rngs=nnx.Rngs(0))


class MLPTest(parameterized.TestCase):

  @parameterized.parameters(("silu", _silu), ("gelu_tanh", _gelu_tanh))
  def test_matches_formula(self, activation, formula):
    layer = _mlp(activation)
    x = np.random.RandomState(0).normal(size=(2, 3, 6)).astype(np.float32)
    gate, up, down = (np.asarray(p.kernel[...])
                      for p in (layer.gate, layer.up, layer.down))
    want = (formula(x @ gate) * (x @ up)) @ down
    trees.assert_close(layer(x), want, rtol=1e-5, scaled_atol=1e-5)

  def test_clamped_swiglu_matches_numpy(self):
    # Values beyond +-7 on both inputs exercise the clamps.
    gate, up = np.random.RandomState(1).normal(
        scale=6.0, size=(2, 500)).astype(np.float32)
    self.assertGreater((gate > 7).sum(), 0)
    self.assertGreater((up < -7).sum(), 0)
    np.testing.assert_allclose(mlp.clamped_swiglu(gate, up),
                               _clamped_swiglu(gate, up), rtol=1e-5,
                               atol=1e-6)
    layer = _mlp("clamped_swiglu")
    x = np.random.RandomState(0).normal(scale=5.0, size=(2, 3, 6)).astype(
        np.float32)
    gate, up, down = (np.asarray(p.kernel[...])
                      for p in (layer.gate, layer.up, layer.down))
    want = _clamped_swiglu(x @ gate, x @ up) @ down
    trees.assert_close(layer(x), want, rtol=1e-5, scaled_atol=1e-5)


if __name__ == "__main__":
  absltest.main()
