"""Tests for maxtext.trainers.train_step and train_state."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs import gemma3
from maxtext.common.model_config import ModelConfig
from maxtext.optim import optimizer
from maxtext.optim import update_guard
from maxtext.sharding import mesh as mesh_lib
from maxtext.trainers import train_state as train_state_lib
from maxtext.trainers import train_step as train_step_lib
from testing import tiny_configs
from testing import trees


def _numpy_cross_entropy(logits, targets, mask):
  logits = logits.astype(np.float64)
  top = logits.max(-1, keepdims=True)
  log_z = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
  target_logit = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
  weight = mask.astype(np.float64)
  return (((log_z - target_logit) * weight).sum() / weight.sum(),
          (log_z**2 * weight).sum() / weight.sum())


def _tiny_model_config() -> ModelConfig:
  values = gemma3.get_config().model.to_dict()
  values.update(vocab_size=64, num_layers=2, embed_dim=16, mlp_dim=32,
                num_heads=2, num_kv_heads=1, head_dim=8,
                query_pre_attn_scalar=8.0, sliding_window=4,
                global_layer_interval=2)
  return ModelConfig.from_dict(values)


def _state(z_loss=0.0, model_config=None, **guard):
  """A fresh state of `model_config` (default: a tiny Gemma 3); `guard`
  (if given) are `skip_bad_updates` options."""
  opt_values = gemma3.get_config().optimizer.to_dict()
  opt_values.update(learning_rate=1e-2, warmup_steps=2, z_loss=z_loss)
  opt_config = optimizer.OptimizerConfig(**opt_values)
  the_mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(
      ici=mesh_lib.AxisSizes(data=-1)))
  tx = optimizer.make_optimizer(opt_config, total_steps=10)
  if guard:
    tx = update_guard.skip_bad_updates(tx, **guard)
  return train_state_lib.create_train_state(
      model_config or _tiny_model_config(), seed=0,
      tx=tx,
      schedule=optimizer.learning_rate_schedule(opt_config, total_steps=10),
      z_loss=z_loss, mesh=the_mesh)


def _batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 64, size=(2, 9), dtype=np.int32)
  mask = np.ones((2, 8), np.int32)
  mask[1, 5:] = 0
  return {"inputs": jnp.asarray(tokens[:, :-1]),
          "targets": jnp.asarray(tokens[:, 1:]), "mask": jnp.asarray(mask)}


class CrossEntropyTest(absltest.TestCase):

  def test_matches_numpy(self):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(3, 5, 11)).astype(np.float32) * 4
    targets = rng.integers(0, 11, size=(3, 5))
    mask = rng.integers(0, 2, size=(3, 5))
    mask[0, 0] = 1
    loss, z_term = train_step_lib.cross_entropy(jnp.asarray(logits),
                                                jnp.asarray(targets),
                                                jnp.asarray(mask))
    want_loss, want_z = _numpy_cross_entropy(logits, targets, mask)
    # Log-sum-exps of logits up to ~15 in float32 against float64.
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
    np.testing.assert_allclose(float(z_term), want_z, rtol=1e-5)

  def test_gradient_matches_autodiff_of_log_softmax(self):
    # The custom gradient (softmax recomputed from the kept exponentials,
    # no one-hot buffer) against autodiff of the textbook formula, with
    # logits large enough that an unshifted exp would overflow.
    rng = np.random.default_rng(2)
    logits = jnp.asarray(rng.normal(size=(3, 5, 11)).astype(np.float32) * 40)
    batch = {"targets": jnp.asarray(rng.integers(0, 11, size=(3, 5))),
             "mask": jnp.asarray(rng.integers(0, 2, size=(3, 5)))}

    def objective(cross_entropy, logits):
      loss, z_term = cross_entropy(logits)
      return loss + 0.3 * z_term

    got = jax.grad(functools.partial(objective, lambda l: (
        train_step_lib.cross_entropy(l, batch["targets"], batch["mask"]))))(
            logits)
    want = jax.grad(functools.partial(
        objective, lambda l: _log_softmax_cross_entropy(l, batch)))(logits)
    self.assertTrue(np.all(np.isfinite(got)))
    # z-term gradients scale with the log-sum-exps (~100): within 1e-5 of
    # the largest magnitude.
    trees.assert_close(got, want, rtol=1e-5, scaled_atol=1e-5)

  def test_masked_targets_do_not_count(self):
    logits = jnp.zeros((1, 2, 4)).at[0, 1, 0].set(100.0)
    loss, _ = train_step_lib.cross_entropy(logits, jnp.array([[1, 1]]),
                                           jnp.array([[1, 0]]))
    self.assertAlmostEqual(float(loss), np.log(4), places=5)
    empty, _ = train_step_lib.cross_entropy(logits, jnp.array([[1, 1]]),
                                            jnp.array([[0, 0]]))
    self.assertEqual(float(empty), 0.0)


class TrainStepTest(parameterized.TestCase):

  def _reference(self, state, batch, z_loss):
    """Loss, z-term and gradient norm computed directly from the model."""
    params = jax.tree.map(jnp.copy, state.params)

    def objective(params):
      logits = state.replace(params=params).model()(batch["inputs"])
      loss, z_term = _log_softmax_cross_entropy(logits, batch)
      return loss + z_loss * z_term, (loss, z_term)

    (_, (loss, z_term)), grads = jax.jit(
        jax.value_and_grad(objective, has_aux=True))(params)
    return float(loss), float(z_term), float(optax.tree.norm(grads)), params

  def test_one_step(self):
    z_loss = 0.5  # Large enough to change the gradient norm visibly.
    state, batch = _state(z_loss), _batch()
    want_loss, z_term, want_norm, params_before = self._reference(
        state, batch, z_loss)
    *_, norm_without_z, _ = self._reference(state, batch, 0.0)
    self.assertGreater(abs(want_norm - norm_without_z), 1e-3)
    new_state, metrics = train_step_lib.train_step(state, batch)
    self.assertEqual(int(new_state.step), 1)
    # Another program (the custom cross-entropy gradient) summing in
    # another order: within 1e-5 relative.
    np.testing.assert_allclose(float(metrics["train/loss"]), want_loss,
                               rtol=1e-5)
    np.testing.assert_allclose(float(metrics["grads/global_norm"]),
                               want_norm, rtol=1e-5)
    self.assertAlmostEqual(float(metrics["train/learning_rate"]), 5e-3)
    np.testing.assert_allclose(float(metrics["train/z_loss"]),
                               z_loss * z_term, rtol=1e-5)
    changed = jax.tree.map(lambda a, b: bool(np.any(a != b)),
                           new_state.params, params_before)
    self.assertTrue(all(jax.tree.leaves(changed)))

  def test_abstract_state_matches_the_real_one(self):
    state = _state()
    abstract = train_state_lib.create_train_state(
        _tiny_model_config(), seed=0, tx=state.tx, schedule=state.schedule,
        z_loss=0.0, mesh=mesh_lib.make_mesh(
            mesh_lib.MeshConfig(ici=mesh_lib.AxisSizes(data=-1))),
        abstract=True)
    self.assertEqual(jax.tree.structure(abstract.checkpoint_tree()),
                     jax.tree.structure(state.checkpoint_tree()))
    jax.tree.map(lambda a, b: self.assertEqual((a.shape, a.dtype),
                                               (b.shape, b.dtype)),
                 abstract.checkpoint_tree(), state.checkpoint_tree())

  def test_spike_batch_is_skipped_and_leaves_the_state_unchanged(self):
    window, zscore = 4, 3.0
    state = _state(skip_nonfinite=True, spike_zscore=zscore,
                   spike_window=window)
    good = _batch()
    # Targets the model, trained on `good`, finds unlikely: a loss spike.
    spike = dict(good, targets=(good["targets"] + 17) % 64)
    accepted, skips = [], []
    for batch in [good] * 6 + [spike, good]:
      before = jax.tree.map(np.asarray, (state.params, state.opt_state))
      state, metrics = train_step_lib.train_step(state, batch)
      observed = [float(metrics["train/loss"]),
                  float(metrics["grads/global_norm"])]
      # The rule of update_guard, from the reported metrics.
      recent = np.asarray(accepted[-window:])
      expect_skip = len(accepted) >= window and bool(np.any(
          np.asarray(observed) > recent.mean(0) + zscore * recent.std(0)))
      self.assertEqual(bool(metrics["train/skipped"]), expect_skip)
      skips.append(expect_skip)
      if expect_skip:
        jax.tree.map(np.testing.assert_array_equal,
                     (state.params, state.opt_state.inner_state),
                     (before[0], before[1].inner_state))
      else:
        accepted.append(observed)
    self.assertEqual(skips, [False] * 6 + [True, False])
    self.assertEqual(float(metrics["train/skipped_steps"]), 1.0)
    self.assertEqual(int(state.step), 8)  # The data moved on.

  # Gemma 3, and a tiny model of each family added since (their own
  # layers: OLMo 3's post-norms only and q/k norms over the projection,
  # DeepSeek-V2's routing, Llama 4's chunks, NoPE and experts on inputs,
  # Gemma 4's wider global heads whose values are their keys; e2b's
  # per-layer inputs and last three layers reading earlier layers' keys and
  # values, their MLP twice as wide).
  @parameterized.parameters(
      (None, {}), ("olmo3", {}), ("deepseek2", {}), ("llama4", {}),
      ("gemma4", {}), ("qwen3_next", {}),
      ("gemma4", dict(num_layers=6, per_layer_input_dim=8,
                      kv_shared_layers=3, mlp_kv_shared_dim=96)))
  def test_loss_falls_on_a_repeated_batch(self, family, changes):
    state = _state(model_config=family and tiny_configs.tiny_model_config(
        family, window=4, **changes))
    batch = _batch()
    losses = []
    for _ in range(10):
      state, metrics = train_step_lib.train_step(state, batch)
      losses.append(float(metrics["train/loss"]))
    self.assertLess(losses[-1], 0.7 * losses[0])


def _log_softmax_cross_entropy(logits, batch):
  """Masked cross-entropy and z-term, written with log_softmax."""
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(log_probs, batch["targets"][..., None],
                             -1)[..., 0]
  weight = batch["mask"].astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1)
  return ((nll * weight).sum() / weight.sum(),
          (log_z**2 * weight).sum() / weight.sum())


if __name__ == "__main__":
  absltest.main()
