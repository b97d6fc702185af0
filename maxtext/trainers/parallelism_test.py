"""Sharded == single-device: FSDP, tensor, sequence, expert-as-batch, pipeline.

Runs on 8 fake CPU devices (JAX_NUM_CPU_DEVICES=8,
set by the Bazel target). For each mesh, a tiny Gemma 3 built with the default
rule tables gives the same loss and gradients as on one device (fp32), and
one train step gives the same parameters. Also: gradient accumulation over
microbatches equals the large-batch step, a 4-layer model run as a 2-stage
pipeline equals the same model without a pipeline on one device, and ZeRO-1
and optimizer-state offloading give the same step with the optimizer state
laid out as asked; OLMo 3's q/k norms over all heads give the single-device
step with the heads split over `tensor`; so do Gemma 4 e2b's per-layer inputs
and shared keys and values.
"""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np

from configs import common
from configs import gemma3
from maxtext.common.model_config import ModelConfig
from maxtext.kernels import dispatch
from maxtext.layers import pipeline
from maxtext.models import execution
from maxtext.optim import optimizer
from maxtext.sharding import mesh as mesh_lib
from maxtext.sharding import rules as rules_lib
from maxtext.trainers import train_state as train_state_lib
from maxtext.trainers import train_step as train_step_lib
from testing import devices
from testing import tiny_configs
from testing import trees

_RTOL = 1e-4
_ATOL = 1e-5
# Updated parameters: Adam's first step moves each weight by about the
# learning rate whatever its gradient's size, so rounding of a gradient near
# zero shows in the updated weight (8.4e-6 on a leaf of 0.58 seen here, up
# to 1.2e-4 on OLMo 3's below): within 1e-3 of each leaf's largest
# magnitude.
_PARAMS_ATOL_SCALE = 1e-3


def _model_config(**overrides) -> ModelConfig:
  values = gemma3.get_config().model.to_dict()
  values.update(vocab_size=64, num_layers=2, embed_dim=16, mlp_dim=32,
                num_heads=4, num_kv_heads=2, head_dim=8,
                query_pre_attn_scalar=8.0, sliding_window=4,
                global_layer_interval=2)
  values.update(overrides)
  return ModelConfig.from_dict(values)


def _state(ici: dict[str, int], devices, microbatches: int = 1,
           model_config: ModelConfig | None = None,
           pipeline_config: pipeline.PipelineConfig = pipeline.PipelineConfig(),
           kernel: dispatch.Kernel = dispatch.Kernel(), **sharding_options):
  opt_values = gemma3.get_config().optimizer.to_dict()
  opt_values.update(learning_rate=1e-2, warmup_steps=1, z_loss=1e-3)
  opt_config = optimizer.OptimizerConfig(**opt_values)
  mesh = mesh_lib.make_mesh(
      mesh_lib.MeshConfig(ici=mesh_lib.AxisSizes(**ici)), devices)
  rules = rules_lib.LogicalRules.from_config(
      mesh, rules_lib.ShardingConfig(**{**common.sharding_defaults(),
                                        **sharding_options}))
  return train_state_lib.create_train_state(
      model_config or _model_config(),
      execution=execution.Execution(attention_kernel=kernel,
                                    pipeline=pipeline_config), seed=0,
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
def _loss_grads_and_step(state, batch):
  """(loss, gradients, state after one train step), one compile."""
  loss, z_term, grads, moe_stats = train_step_lib.loss_and_grads(state, batch)
  new_state, _ = train_step_lib.apply_gradients(state, loss, z_term, grads,
                                                moe_stats)
  return loss, grads, new_state


def _loss_grads_and_update(state, batch):
  """(loss, gradients, parameters after one train step)."""
  loss, grads, new_state = _loss_grads_and_step(state, batch)
  return loss, grads, new_state.params


@functools.cache
def _single_device_pipeline_reference():
  """(loss, grads, new params) of the 4-layer model without a pipeline."""
  state = _state({"data": -1}, jax.devices()[:1],
                 model_config=_model_config(num_layers=4))
  return _loss_grads_and_update(state, _batch(state))


def _sharded_axes(params) -> list[str]:
  """Every mesh axis that splits some parameter."""
  specs = jax.tree.leaves(jax.tree.map(lambda x: x.sharding.spec, params),
                          is_leaf=lambda x: isinstance(
                              x, jax.sharding.PartitionSpec))
  return [axis for spec in specs for dim in spec if dim is not None
          for axis in ((dim,) if isinstance(dim, str) else dim)]


def _assert_trees_close(got, want, *, scaled_atol: float = 1e-4):
  """Leaf by leaf within `_RTOL` and `_ATOL`, or `scaled_atol` times the
  leaf's largest magnitude if larger (gradients summed in another order
  differ with the magnitudes summed, not with the element)."""
  trees.assert_trees_close(got, want, rtol=_RTOL, atol=_ATOL,
                           scaled_atol=scaled_atol)


class ParallelismTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    devices.require_devices(8)
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
    self.assertIn(sharded_axis, _sharded_axes(state.params))
    loss, grads, new_params = _loss_grads_and_update(state, batch)
    np.testing.assert_allclose(float(loss), float(self.single_loss),
                               rtol=_RTOL)
    _assert_trees_close(grads, self.single_grads)
    _assert_trees_close(new_params, self.single_params,
                        scaled_atol=_PARAMS_ATOL_SCALE)
    # The update keeps the layout: parameters stay sharded as created.
    jax.tree.map(lambda a, b: self.assertTrue(
        a.sharding.is_equivalent_to(b.sharding, a.ndim),
        f"{a.sharding} != {b.sharding}"), new_params, state.params)

  @parameterized.named_parameters(
      ("stage", {"data": 4, "stage": 2}, 0),
      ("data_fsdp_stage", {"data": 2, "fsdp": 2, "stage": 2}, 4),
      ("fsdp_tensor_stage", {"data": 1, "fsdp": 2, "tensor": 2, "stage": 2},
       2),
  )
  def test_pipeline_equals_single_device(self, ici, pipeline_microbatches):
    want_loss, want_grads, want_params = _single_device_pipeline_reference()
    state = _state(ici, jax.devices(),
                   model_config=_model_config(num_layers=4),
                   pipeline_config=pipeline.PipelineConfig(
                       stages=2, microbatches=pipeline_microbatches))
    # Each stage's devices hold only its two layers.
    kernel = state.params["blocks"]["mlp"]["up"]["kernel"]
    self.assertEqual(kernel.sharding.spec[0], "stage")
    self.assertEqual(kernel.addressable_shards[0].data.shape[0], 2)
    loss, grads, new_params = _loss_grads_and_update(state, _batch(state))
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=_RTOL)
    _assert_trees_close(grads, want_grads)
    _assert_trees_close(new_params, want_params,
                        scaled_atol=_PARAMS_ATOL_SCALE)
    jax.tree.map(lambda a, b: self.assertTrue(
        a.sharding.is_equivalent_to(b.sharding, a.ndim),
        f"{a.sharding} != {b.sharding}"), new_params, state.params)

  def test_pipeline_stages_must_match_the_mesh(self):
    with self.assertRaisesRegex(
        ValueError, r"pipeline.stages=1 must equal the size of the 'stage'"
        r" mesh axis, 2"):
      _state({"data": 4, "stage": 2}, jax.devices(),
             model_config=_model_config(num_layers=4))

  def test_microbatches_equal_one_large_batch(self):
    for microbatches in (2, 4):
      state = _state({"data": 1, "fsdp": 2}, jax.devices()[:2],
                     microbatches=microbatches)
      batch = _batch(state)
      loss, grads, new_params = _loss_grads_and_update(state, batch)
      np.testing.assert_allclose(float(loss), float(self.single_loss),
                                 rtol=_RTOL)
      _assert_trees_close(grads, self.single_grads)
      _assert_trees_close(new_params, self.single_params,
                          scaled_atol=_PARAMS_ATOL_SCALE)

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

  def _moments(self, state):
    """Adam's mu and nu of the embedding (64, 16)."""
    moments = [x for x in jax.tree.leaves(state.opt_state)
               if x.shape == (64, 16)]
    self.assertLen(moments, 2)
    return moments

  @parameterized.named_parameters(
      ("zero1", {"data": 8}, dict(zero1=True),
       P("data", None), None),
      ("zero1_fsdp", {"data": 4, "fsdp": 2}, dict(zero1=True),
       P("data", "fsdp"), None),
      ("offload", {"data": 2, "fsdp": 4}, dict(offload_optimizer_state=True),
       P(None, "fsdp"), "pinned_host"),
      ("zero1_offload", {"data": 2, "fsdp": 4},
       dict(zero1=True, offload_optimizer_state=True),
       P("data", "fsdp"), "pinned_host"),
  )
  def test_optimizer_state_layout_options(self, ici, options, moment_spec,
                                          memory_kind):
    state = _state(ici, jax.devices(), **options)
    embedding = state.params["embedder"]["embedding"]
    # Parameters keep the default layout: replicated over data.
    self.assertNotIn("data", _sharded_axes(state.params))
    loss, grads, new_state = _loss_grads_and_step(state, _batch(state))
    np.testing.assert_allclose(float(loss), float(self.single_loss),
                               rtol=_RTOL)
    _assert_trees_close(grads, self.single_grads)
    _assert_trees_close(new_state.params, self.single_params,
                        scaled_atol=_PARAMS_ATOL_SCALE)
    # Same devices, spec and memory kind, before and after the step.
    want = jax.sharding.NamedSharding(state.rules.mesh, moment_spec,
                                      memory_kind=memory_kind)
    for moments in (self._moments(state), self._moments(new_state)):
      for moment in moments:
        self.assertTrue(moment.sharding.is_equivalent_to(want, 2),
                        f"{moment.sharding}")
    # Each device holds 1/8 of a moment (ZeRO-1: data splits the rest).
    if "zero1" in options:
      self.assertEqual(
          self._moments(new_state)[0].addressable_shards[0].data.size,
          64 * 16 // 8)
    new_embedding = new_state.params["embedder"]["embedding"]
    self.assertTrue(new_embedding.sharding.is_equivalent_to(
        embedding.sharding, 2), f"{new_embedding.sharding}")


class NormsAcrossShardsTest(parameterized.TestCase):
  """OLMo 3's q/k norms span every head of the projection: with the heads
  split over `tensor`, their mean square is reduced across the shards."""

  @parameterized.named_parameters(
      ("tensor", {"data": 2, "tensor": 4}),
      ("fsdp_tensor", {"data": 1, "fsdp": 2, "tensor": 4}),
  )
  def test_sharded_equals_single_device(self, ici):
    devices.require_devices(8)
    cfg = tiny_configs.tiny_model_config("olmo3", window=4, num_layers=4)
    self.assertEqual(cfg.attention.qk_norm_over, "projection")
    state = _state({"data": -1}, jax.devices()[:1], model_config=cfg)
    want = _loss_grads_and_update(state, _batch(state))
    state = _state(ici, jax.devices(), model_config=cfg)
    self.assertIn("tensor", _sharded_axes(
        state.params["blocks"]["attention"]["query_norm"]))
    loss, grads, new_params = _loss_grads_and_update(state, _batch(state))
    np.testing.assert_allclose(float(loss), float(want[0]), rtol=_RTOL)
    # Within 1e-3 of each leaf's scale: Adam's first step moves each weight
    # by about the learning rate whatever its gradient's size, so rounding
    # of a gradient near zero shows in the updated weight (one element of
    # 6144 here differs by 1.2e-4).
    _assert_trees_close(grads, want[1], scaled_atol=1e-3)
    _assert_trees_close(new_params, want[2], scaled_atol=1e-3)


class SharedKvAcrossShardsTest(absltest.TestCase):
  """Gemma 4 e2b's layers (per-layer inputs, the last three layers reading
  earlier layers' keys and values, their MLP twice as wide) over fsdp,
  tensor and sequence: the loss and gradients equal one device's. (Adam's
  first step turns a gradient within rounding of zero into a step of up to
  the learning rate, so the updated weights are not compared: one of
  6144 differed by 1.3e-3.)"""

  def test_sharded_equals_single_device(self):
    devices.require_devices(8)
    cfg = tiny_configs.tiny_model_config(
        "gemma4", window=4, num_layers=6, per_layer_input_dim=8,
        kv_shared_layers=3, mlp_kv_shared_dim=96)
    state = _state({"data": -1}, jax.devices()[:1], model_config=cfg)
    want = _loss_grads_and_update(state, _batch(state))
    state = _state({"data": 1, "fsdp": 2, "tensor": 2, "sequence": 2},
                   jax.devices(), model_config=cfg)
    self.assertIn("tensor", _sharded_axes(state.params["shared_blocks"]))
    loss, grads, _ = _loss_grads_and_update(state, _batch(state))
    np.testing.assert_allclose(float(loss), float(want[0]), rtol=_RTOL)
    _assert_trees_close(grads, want[1], scaled_atol=1e-3)


class GatedDeltaNetAcrossShardsTest(absltest.TestCase):
  """Qwen3-Next's layers (Gated DeltaNet, gated full attention, experts with
  a gated shared expert) over fsdp, tensor and sequence: the loss and
  gradients equal one device's (the sequence axis gathers the length around
  the convolution and the delta rule's scan over chunks).

  Chunks of 4 tokens: 2 per row of 8, so the state crosses a chunk
  boundary on every mesh."""

  def test_sharded_equals_single_device(self):
    devices.require_devices(8)
    cfg = tiny_configs.tiny_model_config("qwen3_next", window=4,
                                         num_layers=4)
    kernel = dispatch.Kernel(linear_chunk=4)
    state = _state({"data": -1}, jax.devices()[:1], model_config=cfg,
                   kernel=kernel)
    want = _loss_grads_and_update(state, _batch(state))
    state = _state({"data": 1, "fsdp": 2, "tensor": 2, "sequence": 2},
                   jax.devices(), model_config=cfg, kernel=kernel)
    self.assertIn("tensor", _sharded_axes(state.params["linear_blocks"]))
    loss, grads, _ = _loss_grads_and_update(state, _batch(state))
    np.testing.assert_allclose(float(loss), float(want[0]), rtol=_RTOL)
    _assert_trees_close(grads, want[1], scaled_atol=1e-3)


class SparseAttentionAcrossShardsTest(absltest.TestCase):
  """DeepSeek-V3.2's layers (latent attention over each query's top 4 of 8
  tokens, its indexer's heads over tensor, experts) over fsdp, tensor and
  sequence: the loss (with the indexer's) and gradients equal one
  device's."""

  def test_sharded_equals_single_device(self):
    devices.require_devices(8)
    cfg = tiny_configs.tiny_model_config("deepseek3_2", window=4)
    state = _state({"data": -1}, jax.devices()[:1], model_config=cfg)
    want = _loss_grads_and_update(state, _batch(state))
    state = _state({"data": 1, "fsdp": 2, "tensor": 2, "sequence": 2},
                   jax.devices(), model_config=cfg)
    self.assertEqual(
        state.params["blocks"]["attention"]["index_query"]["kernel"]
        .sharding.spec[2], "tensor")
    loss, grads, _ = _loss_grads_and_update(state, _batch(state))
    np.testing.assert_allclose(float(loss), float(want[0]), rtol=_RTOL)
    _assert_trees_close(grads, want[1], scaled_atol=1e-3)


if __name__ == "__main__":
  absltest.main()
