"""Tests of the generic decoder: causality, layouts, packing, gradients."""

import warnings

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from configs import gemma3 as gemma3_config
from configs import llama3 as llama3_config
from configs import qwen3_moe as qwen3_moe_config
from maxtext.common.model_config import ModelConfig
from maxtext.layers import moe
from maxtext.layers import pipeline
from maxtext.layers import remat
from maxtext.models import decoder
from maxtext.models import execution
from maxtext.models import hf_weights
from maxtext.models import registry
from testing import trees

_L = 16


def _tiny(config_module, **changes) -> ModelConfig:
  """The family's small config shrunk further; 5 layers, window 3 < _L."""
  model = config_module.get_config().model
  model.update(vocab_size=64, num_layers=5, embed_dim=32, mlp_dim=48,
               num_heads=4, num_kv_heads=2, head_dim=8, **changes)
  return ModelConfig.from_dict(model)


_CONFIGS = {
    "gemma3": lambda **c: _tiny(gemma3_config, sliding_window=3,
                                global_layer_interval=2, **c),
    "llama3": lambda **c: _tiny(llama3_config, rope_scaling="llama3",
                                rope_scaling_factor=8.0,
                                rope_original_max_length=4, **c),
}


def _tokens(seed=0):
  return np.random.RandomState(seed).randint(0, 64, size=(2, _L))


@nnx.jit
def _logits(model, tokens, positions=None, segment_ids=None):
  return model(tokens, positions, segment_ids)


class DecoderTest(parameterized.TestCase):

  @parameterized.product(family=tuple(_CONFIGS), scan_layers=(True, False))
  def test_future_tokens_never_change_earlier_logits(self, family,
                                                     scan_layers):
    model = registry.create_model(_CONFIGS[family](scan_layers=scan_layers),
                                  rngs=nnx.Rngs(0))
    tokens = _tokens()
    changed = tokens.copy()
    changed[:, 9:] = (changed[:, 9:] + 1) % 64
    logits, logits_changed = _logits(model, tokens), _logits(model, changed)
    self.assertEqual(logits.dtype, jnp.float32)
    self.assertEqual(logits.shape, (2, _L, 64))
    np.testing.assert_array_equal(logits[:, :9], logits_changed[:, :9])
    self.assertGreater(np.abs(logits[:, 9:] - logits_changed[:, 9:]).max(),
                       1e-4)

  @parameterized.parameters(*_CONFIGS)
  def test_scanned_and_unscanned_layouts_give_the_same_logits(self, family):
    scanned = registry.create_model(_CONFIGS[family](scan_layers=True),
                                    rngs=nnx.Rngs(0))
    unscanned = registry.create_model(_CONFIGS[family](scan_layers=False),
                                      rngs=nnx.Rngs(1))
    hf_weights.load_hf_weights(unscanned, hf_weights.to_hf_weights(scanned))
    tokens = _tokens()
    trees.assert_close(_logits(scanned, tokens), _logits(unscanned, tokens),
                       rtol=1e-5, scaled_atol=1e-5)

  @parameterized.parameters(*_CONFIGS)
  def test_packed_sequences_equal_separate_sequences(self, family):
    model = registry.create_model(_CONFIGS[family](), rngs=nnx.Rngs(0))
    tokens = _tokens()
    split = 6
    positions = np.concatenate([np.arange(split), np.arange(_L - split)])
    segment_ids = np.array([1] * split + [2] * (_L - split))
    packed = _logits(model, tokens[:1], positions[None], segment_ids[None])
    first = _logits(model, tokens[:1, :split])
    second = _logits(model, tokens[:1, split:])
    trees.assert_close(packed[:, :split], first, rtol=1e-5, scaled_atol=1e-5)
    trees.assert_close(packed[:, split:], second, rtol=1e-5, scaled_atol=1e-5)

  def test_bfloat16_compute_returns_float32_logits(self):
    model = registry.create_model(_CONFIGS["gemma3"](dtype="bfloat16"),
                                  rngs=nnx.Rngs(0))
    logits = _logits(model, _tokens())
    self.assertEqual(logits.dtype, jnp.float32)
    self.assertTrue(np.isfinite(logits).all())

  def test_gradients_reach_every_parameter(self):
    model = registry.create_model(_CONFIGS["gemma3"](), rngs=nnx.Rngs(0))
    tokens = _tokens()

    def loss(model):
      logits = model(tokens)
      return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    grads = nnx.jit(nnx.grad(loss))(model)
    for path, grad in nnx.to_flat_state(grads):
      self.assertGreater(float(jnp.abs(grad[...]).max()), 0.0, msg=path)

  def test_scanned_parameters_carry_the_layers_axis(self):
    model = registry.create_model(_CONFIGS["llama3"](tie_embeddings=False),
                                  rngs=nnx.Rngs(0))
    names = {
        "/".join(map(str, path)): variable.get_metadata()["out_sharding"]
        for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param))
    }
    self.assertEqual(names["embedder/embedding"], ("vocab", "embed"))
    self.assertEqual(names["head/kernel"], ("embed", "vocab"))
    self.assertEqual(names["final_norm/scale"], ("embed",))
    self.assertEqual(names["blocks/attention/query/kernel"],
                     ("layers", "embed", "heads", "head_dim"))
    self.assertEqual(names["blocks/mlp/down/kernel"],
                     ("layers", "mlp", "embed"))
    self.assertEqual(model.blocks.mlp.down.kernel.shape, (5, 48, 32))

  def test_window_limits_what_a_local_layer_sees(self):
    # One local layer with window 3: the logit at position 10 depends only
    # on tokens 8..10.
    cfg = _CONFIGS["gemma3"]().replace(num_layers=1,
                              global_layer_interval=0)
    model = registry.create_model(cfg, rngs=nnx.Rngs(0))
    tokens = _tokens()
    changed = tokens.copy()
    changed[:, :8] = (changed[:, :8] + 1) % 64
    np.testing.assert_array_equal(_logits(model, tokens)[:, 10],
                                  _logits(model, changed)[:, 10])
    changed[:, 8] = (changed[:, 8] + 1) % 64
    self.assertGreater(
        np.abs(_logits(model, tokens)[:, 10] -
               _logits(model, changed)[:, 10]).max(), 1e-4)

  # Gemma 3 on 4 stages: stages of one local or one global layer.
  @parameterized.parameters(("gemma3", 2, 0, "none"), ("gemma3", 2, 4, "full"),
                            ("gemma3", 4, 4, "full"),
                            ("llama3", 4, 2, "minimal"))
  def test_pipeline_equals_the_plain_layer_scan(self, family, stages,
                                                microbatches, remat_policy):
    # Packed rows with their own positions and segments: each row's
    # positions and segment ids must travel with it through the stages.
    plain_cfg = _CONFIGS[family]().replace(num_layers=4)
    remat_config = remat.RematConfig(policy=remat_policy)
    model = registry.create_model(
        plain_cfg, rngs=nnx.Rngs(0),
        execution=execution.Execution(remat=remat_config))
    graphdef, params = nnx.split(model)
    piped = nnx.graphdef(registry.create_model(
        plain_cfg, rngs=nnx.Rngs(0), execution=execution.Execution(
            pipeline=pipeline.PipelineConfig(stages=stages,
                                             microbatches=microbatches),
            remat=remat_config)))
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, 64, size=(4, _L))
    split = rng.randint(2, _L - 2, size=(4, 1))
    columns = np.arange(_L)[None]
    positions = np.where(columns < split, columns, columns - split)
    segment_ids = np.where(columns < split, 1, 2)

    @jax.jit
    def loss_and_grads(params, graphdef):
      def loss(params):
        logits = nnx.merge(graphdef, params)(tokens, positions, segment_ids)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 0]), logits
      return jax.value_and_grad(loss, has_aux=True)(params)

    (want_loss, want_logits), want_grads = loss_and_grads(params, graphdef)
    (loss, logits), grads = loss_and_grads(params, piped)
    trees.assert_close(logits, want_logits, rtol=1e-5, scaled_atol=1e-5)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    # Summed over the microbatches in another order: within 1e-4 of each
    # leaf's largest magnitude.
    trees.assert_trees_close(grads, want_grads, rtol=1e-4, scaled_atol=1e-4)


def _moe_config(**changes) -> ModelConfig:
  """3 layers, the first dense, 2 with 4 experts (+1 shared), top-2."""
  cfg = _tiny(qwen3_moe_config, num_experts=4, num_experts_per_token=2,
              moe_mlp_dim=16, num_shared_experts=1, first_dense_layers=1,
              load_balance_loss_weight=0.1, router_z_loss_weight=0.01)
  return cfg.replace(num_layers=3, **changes)


def _stacked_copy(unscanned: decoder.Decoder) -> decoder.Decoder:
  """A scan_layers model with the parameters of an unscanned one."""
  model = registry.create_model(
      unscanned.cfg.replace(scan_layers=True), rngs=nnx.Rngs(9))

  def stack(blocks):
    return jax.tree.map(lambda *a: jnp.stack(a),
                        *[nnx.state(block) for block in blocks])

  nnx.update(model.blocks, stack(unscanned.blocks))
  nnx.update(model.dense_blocks, stack(unscanned.dense_blocks))
  for name in ("embedder", "final_norm", "head"):
    nnx.update(getattr(model, name), nnx.state(getattr(unscanned, name)))
  return model


def _sown_aux_loss(model, tokens):
  _, aux_losses = nnx.capture(model, moe.AuxLoss)(tokens)
  return sum(jax.tree.leaves(aux_losses))


class MoEDecoderTest(absltest.TestCase):

  def test_blocks_by_hand(self):
    """Dense blocks then MoE blocks; the sown loss sums the layers'."""
    model = registry.create_model(_moe_config(scan_layers=False),
                                  rngs=nnx.Rngs(0))
    self.assertIsNone(model.dense_blocks[0].moe)
    self.assertIsNone(model.blocks[0].mlp)
    tokens = _tokens()
    x = model.embedder(tokens)
    rotary = model.cfg.rope.global_rotary(
        jnp.broadcast_to(jnp.arange(_L), tokens.shape),
        model.cfg.attention.head_dim)
    want_loss = 0.0
    for block in (*model.dense_blocks, *model.blocks):
      x, _, aux, _ = block(x, rotary, window=None, segment_ids_BL=None)
      if aux is not None:
        want_loss += aux["loss"]
    want_logits = model.head(model.final_norm(x))
    logits, aux_losses = nnx.capture(model, moe.AuxLoss)(tokens)
    trees.assert_close(logits, want_logits, rtol=1e-5, scaled_atol=1e-5)
    self.assertAlmostEqual(float(sum(jax.tree.leaves(aux_losses))),
                           float(want_loss), places=5)
    self.assertGreater(float(want_loss), 0.0)

  def test_sows_only_under_capture(self):
    """Under `nnx.capture` the experts' values come out; outside one the
    model sows nothing and raises no flax deprecation warning."""
    model = registry.create_model(_moe_config(scan_layers=False),
                                  rngs=nnx.Rngs(0))
    tokens = _tokens()
    with warnings.catch_warnings():
      warnings.simplefilter("error", DeprecationWarning)
      logits = model(tokens)
      captured, aux_losses, stats = nnx.capture(
          model, moe.AuxLoss, nnx.Intermediate)(tokens)
    self.assertEmpty(jax.tree.leaves(nnx.state(model, nnx.Intermediate)))
    np.testing.assert_array_equal(logits, captured)
    self.assertGreater(float(aux_losses["aux_loss"][...]), 0.0)
    stats = nnx.to_pure_dict(stats)
    # Each of the 2 expert layers routes 2 * 16 tokens to 2 experts each.
    np.testing.assert_array_equal(stats["expert_load"].sum(-1),
                                  [2 * _L * 2] * 2)
    self.assertEqual(set(stats["moe_metrics"]),
                     {"load_balance_loss", "router_z_loss",
                      "dropped_fraction"})

  def test_scanned_equals_unscanned(self):
    unscanned = registry.create_model(_moe_config(scan_layers=False),
                                      rngs=nnx.Rngs(0))
    scanned = _stacked_copy(unscanned)
    tokens = _tokens()
    trees.assert_close(_logits(scanned, tokens), _logits(unscanned, tokens),
                       rtol=1e-5, scaled_atol=1e-5)
    self.assertAlmostEqual(float(_sown_aux_loss(scanned, tokens)),
                           float(_sown_aux_loss(unscanned, tokens)), places=5)

  def test_cached_decoding_equals_full_forward(self):
    model = registry.create_model(_moe_config(), rngs=nnx.Rngs(0))
    tokens = _tokens()
    positions = np.broadcast_to(np.arange(_L), tokens.shape)

    @nnx.jit
    def step(model, tokens, positions, cache):
      return model(tokens, positions, cache=cache)

    want = _logits(model, tokens)
    logits, cache = step(model, tokens[:, :9], positions[:, :9],
                         model.init_cache(2, _L))
    got = [logits]
    for i in range(9, _L):
      logits, cache = step(model, tokens[:, i:i + 1], positions[:, i:i + 1],
                           cache)
      got.append(logits)
    trees.assert_close(np.concatenate(got, axis=1), want, rtol=1e-5,
                       scaled_atol=1e-5)


if __name__ == "__main__":
  absltest.main()
