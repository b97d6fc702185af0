"""Every remat policy gives the decoder the same loss and gradients.

Also: the "custom" policy (keep / recompute / offload per name) and the
memory XLA plans per policy (`remat.compiled_memory`).
"""

import functools
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from configs import gemma3
from maxtext.common.model_config import ModelConfig
from maxtext.layers import remat
from maxtext.models import execution
from maxtext.models import registry
from testing import trees


# Keeps one activation, offloads two, recomputes the rest.
_CUSTOM = (("mlp_hidden", "keep"), ("out_proj", "offload"),
           ("query_proj", "offload"))


def _config(policy: str, scan_layers: bool, custom=(), **sizes
            ) -> tuple[ModelConfig, remat.RematConfig]:
  values = gemma3.get_config().model.to_dict()
  values.update(vocab_size=64, num_layers=2, embed_dim=16, mlp_dim=32,
                num_heads=2, num_kv_heads=1, head_dim=8,
                query_pre_attn_scalar=8.0, sliding_window=4,
                global_layer_interval=2, scan_layers=scan_layers)
  values.update(sizes)
  return ModelConfig.from_dict(values), remat.RematConfig(policy=policy,
                                                  custom=dict(custom))


def _grad_fn(cfg: ModelConfig, remat_config: remat.RematConfig, tokens):
  """(value_and_grad of a loss over the parameters, the parameters)."""
  graphdef, params = nnx.split(registry.create_model(
      cfg, rngs=nnx.Rngs(0),
      execution=execution.Execution(remat=remat_config)))

  def loss_fn(params):
    logits = nnx.merge(graphdef, params)(tokens)
    return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 0])

  return jax.value_and_grad(loss_fn), params


@functools.lru_cache(maxsize=None)
def _loss_and_grads(policy: str, scan_layers: bool, custom=()):
  tokens = jnp.asarray(
      np.random.default_rng(0).integers(0, 64, size=(2, 8)), jnp.int32)
  grad_fn, params = _grad_fn(*_config(policy, scan_layers, custom), tokens)
  return jax.jit(grad_fn)(params)


def _assert_close(got, want):
  """Within 1e-4 relative, or 1e-4 of the leaf's largest magnitude: the two
  programs fuse and round apart (2.2e-7 on a leaf of 0.43 seen on one CPU,
  more where other kernels sum in another order); a wrong saved or
  recomputed value is off by the leaf's scale."""
  trees.assert_trees_close(got, want, rtol=1e-4, scaled_atol=1e-4)


class RematTest(parameterized.TestCase):

  @parameterized.product(policy=remat.POLICIES[1:],
                         scan_layers=(True, False))
  def test_policy_matches_no_remat(self, policy, scan_layers):
    want_loss, want_grads = _loss_and_grads("none", scan_layers)
    loss, grads = _loss_and_grads(policy, scan_layers)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    _assert_close(grads, want_grads)

  @parameterized.parameters(True, False)
  def test_custom_keep_and_offload_match_no_remat(self, scan_layers):
    want_loss, want_grads = _loss_and_grads("none", scan_layers)
    loss, grads = _loss_and_grads("custom", scan_layers, _CUSTOM)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    _assert_close(grads, want_grads)

  def test_custom_config_is_normalised_and_checked(self):
    _, remat_config = _config("custom", True, {"out_proj": "offload",
                                               "mlp_up": "recompute",
                                               "key_proj": "keep"})
    self.assertEqual(remat_config.custom,
                     (("key_proj", "keep"), ("out_proj", "offload")))
    with self.assertRaisesRegex(ValueError, "'mlp' is not an activation"
                                " name; valid: .*'mlp_hidden'"):
      _config("custom", True, {"mlp": "keep"})
    with self.assertRaisesRegex(ValueError, "'mlp_out': 'save' is not an"
                                " action; valid: .*'offload'"):
      _config("custom", True, {"mlp_out": "save"})
    with self.assertRaisesRegex(ValueError, 'only policy="custom" reads it,'
                                " not remat.policy='full'"):
      _config("full", True, {"mlp_out": "keep"})

  def test_offload_names_a_backend_without_pinned_host_memory(self):
    device = mock.Mock(platform="fakeplatform")
    device.addressable_memories.return_value = []
    with mock.patch.object(remat.jax, "devices", return_value=[device]):
      with self.assertRaisesRegex(
          ValueError, r"offloads \['out_proj', 'query_proj'\], which needs"
          r' "pinned_host" memory; fakeplatform devices have \[\]'):
        remat.custom_policy(_CUSTOM)

  def test_full_remat_needs_less_temp_memory(self):
    # XLA's plan on CPU, scanned layers: full remat needs about a third of
    # the temp memory of none (17.3 vs 50.2 MB here). With unrolled layers
    # CPU plans about the same for both (28.5 MB, full 2 KB more), so only
    # the scanned layout (the default) is compared.
    tokens = jnp.zeros((4, 128), jnp.int32)
    temp = {}
    for policy in ("none", "full"):
      configs = _config(policy, True, num_layers=4, embed_dim=64, mlp_dim=256,
                        num_heads=4, num_kv_heads=2, head_dim=16,
                        query_pre_attn_scalar=16.0)
      temp[policy] = remat.compiled_memory(*_grad_fn(*configs, tokens))[
          "temp_bytes"]
    self.assertLess(temp["full"], temp["none"])

  @parameterized.parameters(1, 2)
  def test_scanned_layers_keep_no_copy_of_their_weights(self, per_group):
    # Under full remat a scanned layer's residual is its slice of the
    # stacked weights, kept by reference: no forward scan over layers may
    # stack a per-layer copy of a weight (per_group local layers of a
    # kind per scan step: 1, or 2 indexed inside the step). Each weight
    # is a per-layer shape no activation of 3 rows here has.
    cfg, remat_config = _config("full", True, num_layers=2 * (per_group + 1),
                                global_layer_interval=per_group + 1)
    tokens = jnp.zeros((3, 8), jnp.int32)
    grad_fn, params = _grad_fn(cfg, remat_config, tokens)
    weights = {tuple(leaf.shape[1:]) for path, leaf in
               jax.tree_util.tree_leaves_with_path(params)
               if "blocks" in jax.tree_util.keystr(path)}
    stacked = []
    for eqn in jax.make_jaxpr(grad_fn)(params).jaxpr.eqns:
      if (eqn.primitive.name == "scan" and
          "transpose" not in str(eqn.source_info.name_stack)):
        extensive = eqn.outvars[eqn.params["num_carry"]:]
        stacked += [v.aval.shape[1:] for v in extensive
                    if tuple(v.aval.shape[1:]) in weights]
    self.assertTrue(weights)
    self.assertEqual(stacked, [])

  def test_unknown_policy_lists_the_valid_ones(self):
    with self.assertRaisesRegex(ValueError, r"remat.policy='some' is invalid;"
                                r" valid values: .*'save_qkv_proj'"):
      _config("some", True)
    with self.assertRaisesRegex(ValueError, r"Unknown remat policy 'some'; "
                                r"valid policies: \['none', 'full'"):
      remat.remat(lambda x: x, "some")

  def test_policy_table_covers_the_config_names(self):
    for policy in remat.POLICIES:
      self.assertTrue(callable(remat.remat(jnp.sin, policy)))


if __name__ == "__main__":
  absltest.main()
