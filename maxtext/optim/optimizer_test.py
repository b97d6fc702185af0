"""Tests for maxtext.optim.optimizer against hand-written numpy references."""

import math

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs import common
from maxtext.optim import optimizer
from testing import trees


def _config(**overrides) -> optimizer.OptimizerConfig:
  values = common.base_config().optimizer.to_dict()
  values.update(overrides)
  return optimizer.OptimizerConfig(**values)


def _numpy_schedule(step, *, peak, warmup, decay_end, ratio):
  if step < warmup:
    return peak * (step + 1) / warmup
  if decay_end <= warmup:
    return peak * ratio
  progress = min(max((step - warmup) / (decay_end - warmup), 0.0), 1.0)
  return peak * (ratio + (1 - ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


class ScheduleTest(parameterized.TestCase):

  def test_landmarks(self):
    config = _config(learning_rate=1e-3, warmup_steps=10, decay_steps=-1,
                     end_learning_rate_ratio=0.1)
    schedule = optimizer.learning_rate_schedule(config, total_steps=110)
    expected = {0: 1e-4, 4: 5e-4, 9: 1e-3, 10: 1e-3, 60: 5.5e-4, 110: 1e-4,
                500: 1e-4}
    for step, value in expected.items():
      self.assertAlmostEqual(float(schedule(step)), value, places=9, msg=step)

  @parameterized.parameters((0, 50, 0.0), (5, 20, 0.5), (20, 20, 0.1),
                            (3, -1, 1.0))
  def test_matches_numpy_reference(self, warmup, decay_steps, ratio):
    config = _config(learning_rate=3e-4, warmup_steps=warmup,
                     decay_steps=decay_steps, end_learning_rate_ratio=ratio)
    total = 40
    schedule = optimizer.learning_rate_schedule(config, total_steps=total)
    decay_end = total if decay_steps == -1 else decay_steps
    steps = np.arange(0, 60)
    got = jax.jit(jax.vmap(schedule))(steps)
    want = [_numpy_schedule(s, peak=3e-4, warmup=warmup, decay_end=decay_end,
                            ratio=ratio) for s in steps]
    # Near the end of a decay to 0, 1 + cos cancels: errors scale with the
    # peak, not the value (within 1e-6 of it).
    trees.assert_close(got, want, rtol=1e-5, atol=1e-12, scaled_atol=1e-6)

  def test_run_shorter_than_warmup_only_warms_up(self):
    schedule = optimizer.learning_rate_schedule(
        _config(learning_rate=1.0, warmup_steps=30, decay_steps=-1,
                end_learning_rate_ratio=0.5), total_steps=10)
    self.assertAlmostEqual(float(schedule(9)), 10 / 30, places=6)
    self.assertAlmostEqual(float(schedule(30)), 0.5, places=6)


class UpdateTest(absltest.TestCase):

  def test_one_update_matches_numpy_adamw(self):
    config = _config(learning_rate=1e-2, warmup_steps=4, decay_steps=-1,
                     b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1,
                     grad_clip_norm=1.0)
    rng = np.random.default_rng(0)
    params = {
        "embed": {"embedding": rng.normal(size=(6, 4)).astype(np.float32)},
        "layers": {"mlp": {"kernel": rng.normal(size=(3, 4, 5))
                           .astype(np.float32)},
                   "norm": {"scale": rng.normal(size=(3, 4))
                            .astype(np.float32)}},
        "bias": rng.normal(size=(5,)).astype(np.float32),
    }
    grads = jax.tree.map(lambda p: rng.normal(size=p.shape).astype(np.float32),
                         params)
    tx = optimizer.make_optimizer(config, total_steps=100)
    state = tx.init(jax.tree.map(jnp.asarray, params))
    updates, _ = tx.update(jax.tree.map(jnp.asarray, grads), state,
                           jax.tree.map(jnp.asarray, params))

    # Reference: clip by global norm, then the first Adam step, then decay.
    leaves = jax.tree.leaves(grads)
    norm = math.sqrt(sum(float(np.sum(g.astype(np.float64)**2))
                         for g in leaves))
    self.assertGreater(norm, 1.0)  # Clipping is active.
    lr = 1e-2 * 1 / 4  # Update 0 of a 4-step warmup.
    decayed = {"embedding": True, "kernel": True, "scale": False,
               "bias": False}

    def reference(path, p, g):
      g = g / norm
      m_hat = g  # (1 - b1) * g / (1 - b1)
      v_hat = g * g
      update = m_hat / (np.sqrt(v_hat) + 1e-8)
      if decayed[path[-1].key]:
        update = update + 0.1 * p
      return -lr * update

    want = jax.tree_util.tree_map_with_path(reference, params, grads)
    trees.assert_trees_close(updates, want, rtol=2e-5, atol=1e-7)

  def test_decay_mask(self):
    params = {"embedder": {"embedding": jnp.zeros((8, 4))},
              "block": {"attn": {"kernel": jnp.zeros((4, 2, 2))},
                        "pre_norm": {"scale": jnp.zeros((3, 4))}},
              "final_norm": {"scale": jnp.zeros((4,))},
              "gain": jnp.zeros((4,))}
    mask = optimizer.weight_decay_mask(params)
    self.assertEqual(mask, {"embedder": {"embedding": True},
                            "block": {"attn": {"kernel": True},
                                      "pre_norm": {"scale": False}},
                            "final_norm": {"scale": False},
                            "gain": False})

  def test_frozen_parameters(self):
    """Only the parameters `trainable` accepts get gradients and updates
    (weight decay included); a frozen model's state stays; None: all."""
    params = {"block": {"index_key": {"kernel": jnp.ones((2, 2))},
                        "mlp": {"kernel": jnp.ones((2, 2))}}}
    trainable = lambda names: "index_key" in names
    grads = jax.grad(lambda p: sum(jnp.sum(x**2) for x in jax.tree.leaves(
        optimizer.stop_frozen_gradients(p, trainable))))(params)
    self.assertEqual(float(jnp.abs(grads["block"]["mlp"]["kernel"]).max()),
                     0.0)
    np.testing.assert_array_equal(grads["block"]["index_key"]["kernel"], 2.0)
    tx = optax.chain(optimizer.make_optimizer(_config(weight_decay=0.5), 10),
                     optimizer.keep_frozen(trainable))
    updates, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_array_equal(updates["block"]["mlp"]["kernel"], 0.0)
    self.assertLess(float(updates["block"]["index_key"]["kernel"].max()), 0)
    tx = optimizer.keep_frozen(None)
    self.assertIs(tx.update(grads, tx.init(params))[0], grads)
    state = {"router": {"bias": jnp.ones(3)}, "index_key": {"x": jnp.ones(1)}}
    new = jax.tree.map(lambda x: x + 1, state)
    kept = optimizer.keep_frozen_state(new, state, trainable)
    np.testing.assert_array_equal(kept["router"]["bias"], 1.0)
    np.testing.assert_array_equal(kept["index_key"]["x"], 2.0)

  def test_clipping_matches_optax(self):
    rng = np.random.default_rng(1)
    grads = {"a": rng.normal(size=(3, 4)).astype(np.float32),
             "b": rng.normal(size=(5,)).astype(np.float32)}
    norm = math.sqrt(sum(float(np.sum(g.astype(np.float64)**2))
                         for g in grads.values()))
    for max_norm, exact in ((2 * norm, True), (norm / 3, False)):
      ours, _ = optimizer.clip_by_global_norm(max_norm).update(grads, ())
      theirs, _ = optax.clip_by_global_norm(max_norm).update(grads, ())
      for name in grads:
        if exact:  # Under the threshold: unchanged, bit for bit.
          np.testing.assert_array_equal(ours[name], grads[name])
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-6)
    # Zero gradients stay zero; a non-finite norm is passed on as optax's.
    zeros = {"a": np.zeros((2,), np.float32)}
    ours, _ = optimizer.clip_by_global_norm(1.0).update(zeros, ())
    np.testing.assert_array_equal(ours["a"], zeros["a"])
    for bad in (np.nan, np.inf):
      grads = {"a": np.array([1.0, bad], np.float32)}
      ours, _ = optimizer.clip_by_global_norm(1.0).update(grads, ())
      theirs, _ = optax.clip_by_global_norm(1.0).update(grads, ())
      np.testing.assert_array_equal(ours["a"], theirs["a"])

  def test_clipping_off_and_invalid_values(self):
    config = _config(grad_clip_norm=0.0)
    tx = optimizer.make_optimizer(config, total_steps=100)
    params = {"w": jnp.ones((2, 2))}
    updates, _ = tx.update({"w": jnp.full((2, 2), 100.0)}, tx.init(params),
                           params)
    self.assertTrue(np.all(np.isfinite(updates["w"])))
    with self.assertRaisesRegex(ValueError, "optimizer.b2=1.0"):
      _config(b2=1.0)
    with self.assertRaisesRegex(ValueError, "optimizer.learning_rate=0"):
      _config(learning_rate=0)


if __name__ == "__main__":
  absltest.main()
