"""Sharded == single-device: FSDP, tensor, sequence (and expert-as-batch).

Runs on 8 fake CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8,
set by the Bazel target). For each mesh, a tiny Gemma 3 built with the default
rule tables gives the same loss and gradients as on one device (fp32), and
one train step gives the same parameters. Also: gradient accumulation over
microbatches equals the large-batch step.
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from configs import common
from configs import gemma3
from maxtext.common.model_config import ModelConfig
from maxtext.optim import optimizer
from maxtext.sharding import mesh as mesh_lib
from maxtext.sharding import rules as rules_lib
from maxtext.trainers import train_state as train_state_lib
from maxtext.trainers import train_step as train_step_lib

_RTOL = 1e-4
_ATOL = 1e-5


def _model_config() -> ModelConfig:
  values = gemma3.get_config().model.to_dict()
  values.update(vocab_size=64, num_layers=2, embed_dim=16, mlp_dim=32,
                num_heads=4, num_kv_heads=2, head_dim=8,
                query_pre_attn_scalar=8.0, sliding_window=4,
                global_layer_interval=2)
  return ModelConfig(**values)


def _state(ici: dict[str, int], devices, microbatches: int = 1):
  opt_values = gemma3.get_config().optimizer.to_dict()
  opt_values.update(learning_rate=1e-2, warmup_steps=1, z_loss=1e-3)
  opt_config = optimizer.OptimizerConfig(**opt_values)
  mesh = mesh_lib.make_mesh(
      mesh_lib.MeshConfig(ici=mesh_lib.AxisSizes(**ici)), devices)
  rules = rules_lib.LogicalRules.from_config(
      mesh, rules_lib.ShardingConfig(**common.sharding_defaults()))
  return train_state_lib.create_train_state(
      _model_config(), seed=0,
      tx=optimizer.make_optimizer(opt_config, total_steps=10),
      schedule=optimizer.learning_rate_schedule(opt_config, total_steps=10),
      z_loss=opt_config.z_loss, mesh=mesh, rules=rules,
      microbatches=microbatches)


def _batch(state, rows=8, length=8):
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 64, size=(rows, length + 1), dtype=np.int32)
  mask = np.ones((rows, length), np.int32)
  mask[1, 5:] = 0
  mask[6, 2:] = 0
  sharding = state.rules.batch_sharding((rows, length))
  return {key: jax.device_put(value, sharding) for key, value in
          {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
           "mask": mask}.items()}


@jax.jit
def _loss_grads_and_update(state, batch):
  """(loss, gradients, parameters after one train step), one compile."""
  loss, _, grads = train_step_lib.loss_and_grads(state, batch)
  new_state, _ = train_step_lib.train_step(state, batch)
  return loss, grads, new_state.params


def _assert_trees_close(test, got, want):
  flat_got = jax.tree_util.tree_leaves_with_path(got)
  flat_want = jax.tree.leaves(want)
  test.assertEqual(len(flat_got), len(flat_want))
  for (path, a), b in zip(flat_got, flat_want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=_RTOL,
                               atol=_ATOL,
                               err_msg=jax.tree_util.keystr(path))


class ParallelismTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    if jax.device_count() < 8:
      raise absltest.SkipTest(
          "needs 8 devices: XLA_FLAGS=--xla_force_host_platform_device_count=8")
    state = _state({"data": -1}, jax.devices()[:1])
    batch = _batch(state)
    cls.single_loss, cls.single_grads, cls.single_params = (
        _loss_grads_and_update(state, batch))

  @parameterized.named_parameters(
      ("fsdp", {"data": 1, "fsdp": 8}, "fsdp"),
      ("tensor", {"data": 2, "tensor": 4}, "tensor"),
      ("sequence", {"data": 2, "sequence": 4}, "sequence"),
      ("fsdp_tensor_sequence", {"data": 1, "fsdp": 2, "tensor": 2,
                                "sequence": 2}, "tensor"),
      ("expert_as_batch", {"data": 1, "fsdp": 2, "expert": 4}, "expert"),
  )
  def test_sharded_equals_single_device(self, ici, sharded_axis):
    state = _state(ici, jax.devices())
    self.assertEqual(state.rules.mesh.size, 8)
    batch = _batch(state)
    # The parameters really are split over the axis under test (expert and
    # sequence shard the embed dim together with fsdp).
    specs = jax.tree.leaves(jax.tree.map(lambda x: x.sharding.spec,
                                         state.params),
                            is_leaf=lambda x: isinstance(
                                x, jax.sharding.PartitionSpec))
    flat = [axis for spec in specs for dim in spec if dim is not None
            for axis in ((dim,) if isinstance(dim, str) else dim)]
    self.assertIn(sharded_axis, flat)
    loss, grads, new_params = _loss_grads_and_update(state, batch)
    np.testing.assert_allclose(float(loss), float(self.single_loss),
                               rtol=_RTOL)
    _assert_trees_close(self, grads, self.single_grads)
    _assert_trees_close(self, new_params, self.single_params)
    # The update keeps the layout: parameters stay sharded as created.
    jax.tree.map(lambda a, b: self.assertTrue(
        a.sharding.is_equivalent_to(b.sharding, a.ndim),
        f"{a.sharding} != {b.sharding}"), new_params, state.params)

  def test_microbatches_equal_one_large_batch(self):
    for microbatches in (2, 4):
      state = _state({"data": 1, "fsdp": 2}, jax.devices()[:2],
                     microbatches=microbatches)
      batch = _batch(state)
      loss, grads, new_params = _loss_grads_and_update(state, batch)
      np.testing.assert_allclose(float(loss), float(self.single_loss),
                                 rtol=_RTOL)
      _assert_trees_close(self, grads, self.single_grads)
      _assert_trees_close(self, new_params, self.single_params)

  def test_optimizer_state_is_sharded_like_the_params(self):
    state = _state({"data": 1, "fsdp": 8}, jax.devices())
    embedding = state.params["embedder"]["embedding"]
    moments = [x for x in jax.tree.leaves(state.opt_state)
               if x.shape == embedding.shape]
    self.assertLen(moments, 2)  # Adam's mu and nu.
    for moment in moments:
      self.assertEqual(moment.sharding, embedding.sharding)
    self.assertEqual(embedding.sharding.spec,
                     jax.sharding.PartitionSpec(None, "fsdp"))
    self.assertEqual(embedding.addressable_shards[0].data.shape,
                     (64, 16 // 8))


if __name__ == "__main__":
  absltest.main()
