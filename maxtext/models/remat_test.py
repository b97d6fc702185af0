"""Every remat policy gives the decoder the same loss and gradients."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from configs import gemma3
from maxtext.common import model_config
from maxtext.common.model_config import ModelConfig
from maxtext.layers import remat
from maxtext.models import registry


def _config(policy: str, scan_layers: bool) -> ModelConfig:
  values = gemma3.get_config().model.to_dict()
  values.update(vocab_size=64, num_layers=2, embed_dim=16, mlp_dim=32,
                num_heads=2, num_kv_heads=1, head_dim=8,
                query_pre_attn_scalar=8.0, sliding_window=4,
                global_layer_interval=2, remat_policy=policy,
                scan_layers=scan_layers)
  return ModelConfig(**values)


@functools.lru_cache(maxsize=None)
def _loss_and_grads(policy: str, scan_layers: bool):
  model = registry.create_model(_config(policy, scan_layers),
                                rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  tokens = jnp.asarray(
      np.random.default_rng(0).integers(0, 64, size=(2, 8)), jnp.int32)

  def loss_fn(params):
    logits = nnx.merge(graphdef, params)(tokens)
    return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 0])

  return jax.jit(jax.value_and_grad(loss_fn))(params)


class RematTest(parameterized.TestCase):

  @parameterized.product(policy=model_config.REMAT_POLICIES[1:],
                         scan_layers=(True, False))
  def test_policy_matches_no_remat(self, policy, scan_layers):
    want_loss, want_grads = _loss_and_grads("none", scan_layers)
    loss, grads = _loss_and_grads(policy, scan_layers)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5,
                                                         atol=1e-7),
                 grads, want_grads)

  def test_unknown_policy_lists_the_valid_ones(self):
    with self.assertRaisesRegex(ValueError, r"remat_policy='some'.*"
                                r"'save_qkv_proj'"):
      _config("some", True)
    with self.assertRaisesRegex(ValueError, r"Unknown remat policy 'some'; "
                                r"valid policies: \['none', 'full'"):
      remat.remat(lambda x: x, "some")

  def test_policy_table_covers_the_config_names(self):
    for policy in model_config.REMAT_POLICIES:
      self.assertTrue(callable(remat.remat(jnp.sin, policy)))


if __name__ == "__main__":
  absltest.main()
