"""bfloat16 parameters train like float32 ones.

A tiny Gemma 3 starts from the same weights (float32, and the same values
rounded to bfloat16) and takes 10 AdamW steps on one batch; the bfloat16 run's
losses stay within 1e-2 of the float32 run's (measured: at most 3e-3 over 20
steps) and its parameters stay bfloat16. optax keeps AdamW's moments in the
parameters' dtype, so they are bfloat16 too.
"""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from configs import gemma3
from maxtext.common.model_config import ModelConfig
from maxtext.optim import optimizer
from maxtext.sharding import mesh as mesh_lib
from maxtext.trainers import train_state as train_state_lib
from maxtext.trainers import train_step as train_step_lib

_STEPS = 10


def _state(param_dtype: str) -> train_state_lib.TrainState:
  values = gemma3.get_config().model.to_dict()
  values.update(vocab_size=64, num_layers=2, embed_dim=32, mlp_dim=64,
                num_heads=4, num_kv_heads=2, head_dim=8,
                query_pre_attn_scalar=8.0, sliding_window=4,
                global_layer_interval=2, param_dtype=param_dtype)
  opt_values = gemma3.get_config().optimizer.to_dict()
  opt_values.update(learning_rate=1e-2, warmup_steps=1)
  opt_config = optimizer.OptimizerConfig(**opt_values)
  return train_state_lib.create_train_state(
      ModelConfig.from_dict(values), seed=0,
      tx=optimizer.make_optimizer(opt_config, total_steps=_STEPS),
      schedule=optimizer.learning_rate_schedule(opt_config, _STEPS),
      z_loss=0.0, mesh=mesh_lib.make_mesh(mesh_lib.MeshConfig(),
                                          jax.devices()[:1]))


def _train(state):
  """Losses of `_STEPS` updates on one batch, and the final state."""
  tokens = np.random.default_rng(0).integers(0, 64, size=(8, 17),
                                             dtype=np.int32)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
           "mask": np.ones((8, 16), np.int32)}
  losses = []
  for _ in range(_STEPS):
    state, metrics = train_step_lib.train_step(state, batch)
    losses.append(float(metrics["train/loss"]))
  return np.array(losses), state


class PrecisionTest(absltest.TestCase):

  def test_bfloat16_parameters_track_float32(self):
    reference = _state("float32")
    # Copied: the train step donates the state's buffers.
    init = jax.tree.map(jnp.copy, reference.params)
    want, _ = _train(reference)
    state = _state("bfloat16")
    params = jax.tree.map(lambda x, p: x.astype(p.dtype), init, state.params)
    losses, state = _train(state.replace(params=params,
                                         opt_state=state.tx.init(params)))
    np.testing.assert_allclose(losses, want, rtol=0, atol=1e-2)
    self.assertLess(losses[-1], 0.5 * losses[0])
    self.assertEqual({x.dtype for x in jax.tree.leaves(state.params)},
                     {jnp.dtype(jnp.bfloat16)})
    moments = {x.dtype for x in jax.tree.leaves(state.opt_state)
               if x.ndim > 0}
    self.assertEqual(moments, {jnp.dtype(jnp.bfloat16)})


if __name__ == "__main__":
  absltest.main()
