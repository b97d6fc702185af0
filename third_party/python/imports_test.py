"""Every locked package that maxtext uses imports under the hermetic toolchain."""

import importlib

from absl.testing import absltest
from absl.testing import parameterized

_RUNTIME = (
    "flax.nnx",
    "grain",
    "jax",
    "ml_collections",
    "optax",
    "orbax.checkpoint",
    "qwix",
    "sentencepiece",
    "tensorboardX",
    "tokenizers",
    "tunix",
)
_TEST_ONLY = ("safetensors.numpy", "torch", "transformers")


class ImportsTest(parameterized.TestCase):

  @parameterized.parameters(*_RUNTIME, *_TEST_ONLY)
  def test_imports(self, module):
    self.assertIsNotNone(importlib.import_module(module))

  def test_jax_computes_on_cpu(self):
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

    self.assertEqual(jax.default_backend(), "cpu")
    self.assertEqual(float(jax.jit(lambda x: (x * x).sum())(jnp.arange(4.0))), 14.0)

  def test_torch_and_jax_agree(self):
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top

    x = np.linspace(-3, 3, 7, dtype=np.float32)
    np.testing.assert_allclose(
        np.asarray(jnp.tanh(x)), torch.tanh(torch.from_numpy(x)).numpy(), rtol=1e-6
    )


if __name__ == "__main__":
  absltest.main()
