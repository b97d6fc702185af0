"""Tests of the generic decoder: causality, layouts, packing, gradients."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from configs import gemma3 as gemma3_config
from configs import llama3 as llama3_config
from maxtext.common.model_config import ModelConfig
from maxtext.models import decoder
from maxtext.models import hf_weights
from maxtext.models import registry

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
    np.testing.assert_allclose(_logits(scanned, tokens),
                               _logits(unscanned, tokens), rtol=0, atol=1e-5)

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
    np.testing.assert_allclose(packed[:, :split], first, atol=1e-5)
    np.testing.assert_allclose(packed[:, split:], second, atol=1e-5)

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

  def test_pattern_period(self):
    self.assertEqual(decoder.pattern_period((None,) * 4), 1)
    self.assertEqual(decoder.pattern_period((3, 3, None) * 2 + (3,)), 3)
    self.assertEqual(decoder.pattern_period((3, None, None)), 3)

  def test_window_limits_what_a_local_layer_sees(self):
    # One local layer with window 3: the logit at position 10 depends only
    # on tokens 8..10.
    cfg = dataclasses.replace(_CONFIGS["gemma3"](), num_layers=1,
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


if __name__ == "__main__":
  absltest.main()
