"""Mixture of experts in the train step: auxiliary losses and expert
parallelism.

AuxLossTest: the load-balancing and router z-losses the model sows reach the
training gradients: the gradients with the losses on minus those with them
off equal the gradients of the sown losses alone.

ExpertParallelismTest (8 fake CPU devices; the Bazel target sets
XLA_FLAGS=--xla_force_host_platform_device_count=8): a tiny Mixtral (4
experts, top-2) on a data=1 x fsdp=2 x expert=4 mesh with the default rule
tables has its expert weights split over the `expert` axis, and its loss,
gradients and one train step equal those on one device (fp32), for the
dropless path and for the capacity path with tokens dropped (capacity is
computed over the global batch, so the same ones are). With drops, gradient
entries that are zero up to rounding (~1e-9) can round either way, and
Adam's sign-like first step turns that into a learning-rate sized change,
so there the step is not compared; the capacity path's compiled step must
exchange tokens with all-to-all.
"""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from configs import common
from configs import mixtral
from maxtext.layers import moe
from maxtext.optim import optimizer
from maxtext.sharding import mesh as mesh_lib
from maxtext.sharding import rules as rules_lib
from maxtext.trainers import train_state as train_state_lib
from maxtext.trainers import train_step as train_step_lib
from testing import devices
from testing import tiny_configs

_RTOL = 1e-4
_ATOL = 1e-5


def _state(ici, devices, **model_changes):
  """A tiny Mixtral with 4 experts (2 layers) on a mesh of `devices`."""
  config = mixtral.get_config()
  opt_config = optimizer.OptimizerConfig(**{
      **config.optimizer.to_dict(), "learning_rate": 1e-2,
      "warmup_steps": 1})
  mesh = mesh_lib.make_mesh(
      mesh_lib.MeshConfig(ici=mesh_lib.AxisSizes(**ici)), devices)
  rules = rules_lib.LogicalRules.from_config(
      mesh, rules_lib.ShardingConfig(**common.sharding_defaults()))
  model_config = dataclasses.replace(
      tiny_configs.tiny_model_config("mixtral", window=4, num_layers=2),
      num_experts=4, **model_changes)
  return train_state_lib.create_train_state(
      model_config, seed=0,
      tx=optimizer.make_optimizer(opt_config, total_steps=10),
      schedule=optimizer.learning_rate_schedule(opt_config, total_steps=10),
      z_loss=0.0, mesh=mesh, rules=rules)


def _batch(state, rows=8, length=8):
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 64, size=(rows, length + 1), dtype=np.int32)
  sharding = state.rules.batch_sharding((rows, length))
  return {key: jax.device_put(value, sharding) for key, value in
          {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
           "mask": np.ones((rows, length), np.int32)}.items()}


@jax.jit
def _loss_grads_and_params(state, batch):
  loss, _, grads = train_step_lib.loss_and_grads(state, batch)
  new_state, _ = train_step_lib.train_step(state, batch)
  return loss, grads, new_state.params


def _assert_trees_close(got, want, rtol=_RTOL, atol=_ATOL):
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got),
                          jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol,
                               atol=atol, err_msg=jax.tree_util.keystr(path))


class AuxLossTest(absltest.TestCase):

  def test_aux_loss_reaches_the_training_gradients(self):
    one_device = ({"data": 1}, jax.devices()[:1])
    with_aux = _state(*one_device, load_balance_loss_weight=0.1,
                      router_z_loss_weight=0.01)
    without = _state(*one_device, load_balance_loss_weight=0.0,
                     router_z_loss_weight=0.0)
    batch = _batch(with_aux)
    grads = jax.jit(train_step_lib.loss_and_grads)
    _, _, grads_with = grads(with_aux, batch)
    _, _, grads_without = grads(without, batch)

    def aux_objective(params):
      model = with_aux.replace(params=params).model()
      model(batch["inputs"])
      return sum(jax.tree.leaves(nnx.pop(model, moe.AuxLoss)))

    want = jax.jit(jax.grad(aux_objective))(with_aux.params)
    router = want["blocks"]["moe"]["router"]["kernel"]
    self.assertGreater(float(jnp.abs(router).max()), 1e-4)
    _assert_trees_close(jax.tree.map(jnp.subtract, grads_with, grads_without),
                        want, rtol=1e-3, atol=1e-6)


class ExpertParallelismTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    devices.require_devices(8)

  @parameterized.named_parameters(
      ("dropless", dict(moe_impl="dropless")),
      ("capacity_with_drops", dict(moe_impl="capacity", capacity_factor=0.5)),
  )
  def test_expert_sharded_equals_single_device(self, model_changes):
    single = _state({"data": 1}, jax.devices()[:1], **model_changes)
    want = _loss_grads_and_params(single, _batch(single))
    state = _state({"data": 1, "fsdp": 2, "expert": 4}, jax.devices(),
                   **model_changes)
    # Each device holds one of the 4 experts (of both layers).
    gate = state.params["blocks"]["moe"]["gate"]
    self.assertEqual(gate.sharding.spec[1], "expert")
    self.assertEqual(gate.addressable_shards[0].data.shape[1], 1)
    batch = _batch(state)
    got = _loss_grads_and_params(state, batch)
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=_RTOL)
    _assert_trees_close(got[1], want[1])
    if model_changes["moe_impl"] == "dropless":
      _assert_trees_close(got[2], want[2])
    else:
      hlo = _loss_grads_and_params.lower(state, batch).compile().as_text()
      self.assertIn("all-to-all", hlo)


if __name__ == "__main__":
  absltest.main()
