"""Tests for maxtext.trainers.eval_step against a numpy reference."""

import math

from absl.testing import absltest
import jax.numpy as jnp
import numpy as np

from configs import gemma3
from maxtext.common.model_config import ModelConfig
from maxtext.optim import optimizer
from maxtext.sharding import mesh as mesh_lib
from maxtext.trainers import eval_step
from maxtext.trainers import train_state as train_state_lib


def _state() -> train_state_lib.TrainState:
  values = gemma3.get_config().model.to_dict()
  values.update(vocab_size=64, num_layers=2, embed_dim=16, mlp_dim=32,
                num_heads=2, num_kv_heads=1, head_dim=8,
                query_pre_attn_scalar=8.0, sliding_window=4,
                global_layer_interval=2)
  opt_config = optimizer.OptimizerConfig(**gemma3.get_config().optimizer)
  return train_state_lib.create_train_state(
      ModelConfig.from_dict(values), seed=0,
      tx=optimizer.make_optimizer(opt_config, total_steps=10),
      schedule=optimizer.learning_rate_schedule(opt_config, total_steps=10),
      z_loss=0.0, mesh=mesh_lib.make_mesh(mesh_lib.MeshConfig(
          ici=mesh_lib.AxisSizes(data=-1))))


def _packed_batch(seed: int) -> dict[str, np.ndarray]:
  """Two rows of two segments each (and padding), mask as packing makes it."""
  rng = np.random.default_rng(seed)
  segment_ids = np.array([[1] * 5 + [2] * 3, [1] * 6 + [0] * 2], np.int32)
  positions = np.array([[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 4, 5, 0, 0]],
                       np.int32)
  tokens = rng.integers(1, 64, size=(2, 9), dtype=np.int32)
  mask = (segment_ids > 0).astype(np.int32)
  mask[0, 4] = 0  # The last token of segment 1 predicts nothing.
  mask[1, 5] = 0
  return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "mask": mask,
          "segment_ids": segment_ids, "positions": positions}


class EvalStepTest(absltest.TestCase):

  def test_token_weighted_loss_over_batches_matches_numpy(self):
    state = _state()
    batches = [_packed_batch(seed) for seed in range(3)]
    batches[2]["mask"][:] = 0  # An empty batch adds nothing.
    metrics = eval_step.evaluate(
        state, [{k: jnp.asarray(v) for k, v in b.items()} for b in batches])
    total, count = 0.0, 0
    model = state.model()
    for batch in batches:
      logits = np.asarray(model(
          jnp.asarray(batch["inputs"]),
          positions_BL=jnp.asarray(batch["positions"]),
          segment_ids_BL=jnp.asarray(batch["segment_ids"])), np.float64)
      log_z = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)
                     ) + logits.max(-1)
      target = np.take_along_axis(logits, batch["targets"][..., None],
                                  -1)[..., 0]
      total += ((log_z - target) * batch["mask"]).sum()
      count += batch["mask"].sum()
    self.assertEqual(metrics["eval/tokens"], count)
    # Log-sum-exps over the vocabulary of logits from another program (the
    # jitted step): within 1e-5 relative.
    np.testing.assert_allclose(metrics["eval/loss"], total / count,
                               rtol=1e-5)
    np.testing.assert_allclose(metrics["eval/perplexity"],
                               math.exp(total / count), rtol=1e-5)

  def test_no_batches_is_an_error(self):
    with self.assertRaisesRegex(ValueError, "no batches"):
      eval_step.evaluate(_state(), [])


if __name__ == "__main__":
  absltest.main()
