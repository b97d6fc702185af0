"""Quantization-aware training with qwix on the scanned decoder.

The quantized model keeps the parameters; its logits stay within a measured
distance of full precision (int8: 3% of the largest logit, fp8 e4m3: 11%,
on this tiny random model), it still learns (10 Adam steps on one batch
halve the loss), and a module path that matches nothing is an error.
"""

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs import gemma3
from maxtext.common.model_config import ModelConfig
from maxtext.models import registry
from maxtext.quant import qat

_TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 64, size=(4, 17)),
                      jnp.int32)


def _model(scan_layers=True):
  values = gemma3.get_config().model.to_dict()
  values.update(vocab_size=64, num_layers=4, embed_dim=64, mlp_dim=128,
                num_heads=4, num_kv_heads=2, head_dim=16,
                query_pre_attn_scalar=16.0, sliding_window=4,
                global_layer_interval=2, scan_layers=scan_layers)
  return registry.create_model(ModelConfig.from_dict(values), rngs=nnx.Rngs(0))


def _loss(model):
  logits = model(_TOKENS[:, :-1])
  return optax.softmax_cross_entropy_with_integer_labels(
      logits, _TOKENS[:, 1:]).mean()


class QatTest(parameterized.TestCase):

  @parameterized.parameters(("int8", True, 0.05), ("int8", False, 0.05),
                            ("fp8", True, 0.15))
  def test_logits_stay_near_full_precision(self, qtype, scan_layers,
                                           tolerance):
    model = _model(scan_layers)
    quantized = qat.quantize_for_training(
        model, qat.QatConfig(qtype=qtype), _TOKENS[:, :-1])
    want = model(_TOKENS[:, :-1])
    got = quantized(_TOKENS[:, :-1])
    error = float(jnp.abs(got - want).max() / jnp.abs(want).max())
    self.assertLess(error, tolerance)
    # Quantization really happened: the logits moved.
    self.assertGreater(error, 1e-3)
    # Same parameters, nothing added.
    jax.tree.map(np.testing.assert_array_equal,
                 nnx.state(quantized, nnx.Param), nnx.state(model, nnx.Param))

  def test_quantized_model_trains(self):
    quantized = qat.quantize_for_training(_model(),
                                          qat.QatConfig(qtype="int8"),
                                          _TOKENS[:, :-1])
    graphdef, params = nnx.split(quantized)
    tx = optax.adam(1e-2)

    @jax.jit
    def step(params, opt_state):
      loss, grads = jax.value_and_grad(
          lambda p: _loss(nnx.merge(graphdef, p)))(params)
      updates, opt_state = tx.update(grads, opt_state)
      return optax.apply_updates(params, updates), opt_state, loss

    opt_state = tx.init(params)
    losses = []
    for _ in range(10):
      params, opt_state, loss = step(params, opt_state)
      losses.append(float(loss))
    self.assertLess(losses[-1], 0.5 * losses[0])

  def test_bad_config_is_named(self):
    with self.assertRaisesRegex(ValueError, "qat.qtype='int4' is invalid;"
                                r" valid: \['none', 'fp8', 'int8'\]"):
      qat.QatConfig(qtype="int4")
    with self.assertRaisesRegex(ValueError, "qat.module_path='nothing'"
                                " matches no matmul"):
      qat.quantize_for_training(
          _model(), qat.QatConfig(qtype="int8", module_path="nothing"),
          _TOKENS[:, :-1])
    with self.assertRaisesRegex(ValueError, "qat.qtype='none': there is"
                                " nothing to quantize"):
      qat.quantize_for_training(_model(), qat.QatConfig(), _TOKENS[:, :-1])


if __name__ == "__main__":
  absltest.main()
