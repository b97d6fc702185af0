"""Tests for maxtext.optim.update_guard against a NumPy reference."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax

from maxtext.optim import update_guard

_WINDOW = 10
_ZSCORE = 4.0


def _reference_skips(observed, *, skip_nonfinite, zscore, window):
  """Which updates to skip: the module docstring's rule, in NumPy."""
  accepted, skips = [], []
  for values in observed:
    values = np.asarray(values, np.float64)
    bad = skip_nonfinite and not np.all(np.isfinite(values))
    if zscore > 0 and len(accepted) >= window:
      last = np.asarray(accepted[-window:])
      bad = bad or bool(np.any(values > last.mean(0) + zscore * last.std(0)))
    skips.append(bool(bad))
    if not bad:
      accepted.append(values)
  return skips


def _stream(*, nonfinite: bool, seed=0, steps=30):
  """Losses and gradients with a loss spike (update 13) and a gradient-norm
  spike (19), and with `nonfinite` a NaN loss (4) and an infinite gradient
  (8)."""
  rng = np.random.default_rng(seed)
  losses = 2.0 + 0.1 * rng.normal(size=steps)
  grads = [{"w": rng.normal(size=(4, 3)).astype(np.float32),
            "b": rng.normal(size=(3,)).astype(np.float32)}
           for _ in range(steps)]
  if nonfinite:
    losses[4] = np.nan
    grads[8]["w"][1, 2] = np.inf
  losses[13] = 50.0
  grads[19]["w"] *= 40.0
  return losses.astype(np.float32), grads


def _params():
  return {"w": jnp.ones((4, 3), jnp.float32),
          "b": jnp.zeros((3,), jnp.float32)}


class UpdateGuardTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("nonfinite_only", True, 0.0, [4, 8]),
      ("spikes_only", False, _ZSCORE, [13, 19]),
      ("both", True, _ZSCORE, [4, 8, 13, 19]))
  def test_skips_what_the_reference_skips_and_nothing_else(
      self, skip_nonfinite, zscore, injected):
    losses, grads = _stream(nonfinite=skip_nonfinite)
    inner = optax.adamw(1e-2, weight_decay=0.1)
    tx = update_guard.skip_bad_updates(
        inner, skip_nonfinite=skip_nonfinite, spike_zscore=zscore,
        spike_window=_WINDOW)
    norms = [float(optax.tree.norm(g)) for g in grads]
    want_skips = _reference_skips(zip(losses, norms),
                                  skip_nonfinite=skip_nonfinite,
                                  zscore=zscore, window=_WINDOW)

    @jax.jit
    def guarded_step(params, state, grads, loss):
      updates, state = tx.update(grads, state, params, value=loss)
      return optax.apply_updates(params, updates), state

    @jax.jit
    def plain_step(params, state, grads):
      updates, state = inner.update(grads, state, params)
      return optax.apply_updates(params, updates), state

    params, state = _params(), tx.init(_params())
    ref_params, ref_state = _params(), inner.init(_params())
    skips = []
    for loss, grad, skip in zip(losses, grads, want_skips):
      params, state = guarded_step(params, state, grad, loss)
      skips.append(bool(update_guard.step_metrics(state)["train/skipped"]))
      if not skip:  # The reference applies only the good updates.
        ref_params, ref_state = plain_step(ref_params, ref_state, grad)
    self.assertEqual(skips, want_skips)
    # The injected faults, and only they, are skipped.
    self.assertEqual([i for i, skip in enumerate(skips) if skip], injected)
    self.assertEqual(int(state.num_skipped), len(injected))
    self.assertEqual(int(update_guard.step_metrics(state)
                         ["train/skipped_steps"]), len(injected))
    # Skipping equals never having seen those updates.
    jax.tree.map(np.testing.assert_array_equal, params, ref_params)
    jax.tree.map(np.testing.assert_array_equal, state.inner_state, ref_state)

  def test_no_spikes_before_the_window_is_full(self):
    tx = update_guard.skip_bad_updates(optax.sgd(0.1), skip_nonfinite=False,
                                       spike_zscore=1.0, spike_window=3)
    params = {"w": jnp.zeros(())}
    state = tx.init(params)
    skipped = []
    for loss in (1.0, 10.0, 100.0, 1000.0, 1.0):
      _, state = tx.update({"w": jnp.ones(())}, state, params,
                           value=jnp.float32(loss))
      skipped.append(bool(state.skipped))
    # 1000 is a spike over the window [1, 10, 100]; the first three fill it.
    self.assertEqual(skipped, [False, False, False, True, False])

  def test_state_maps_like_the_inner_optimizer_state(self):
    # How train_state derives shardings: parameter-shaped leaves follow the
    # parameters, the guard's window and counters do not.
    tx = update_guard.skip_bad_updates(optax.adam(1e-3), skip_nonfinite=True,
                                       spike_zscore=0.0, spike_window=7)
    params = _params()
    state = tx.init(params)
    labels = optax.tree_map_params(
        tx, lambda _: "param", state, transform_non_params=lambda _: "other")
    self.assertEqual(labels.recent, "other")
    self.assertEqual(labels.num_skipped, "other")
    self.assertEqual(labels.inner_state[0].mu, {"w": "param", "b": "param"})
    self.assertEqual(state.recent.shape, (7, 2))

  def test_a_checkpoint_restores_with_the_guard_switched_or_resized(self):
    # What Orbax's metadata holds for a saved state: a GuardState as a dict
    # of its fields, leaves with shapes and dtypes.
    def saved(state):
      meta = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                          state)
      return (meta._asdict() if isinstance(state, update_guard.GuardState)
              else meta)

    def abstract(state):
      return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
          x.shape, x.dtype, sharding=x.sharding), state)

    def guarded(window):
      return update_guard.skip_bad_updates(
          optax.adam(1e-2), skip_nonfinite=True, spike_zscore=1.0,
          spike_window=window)

    params = _params()
    grads = jax.tree.map(jnp.ones_like, params)
    on = guarded(2).init(params)
    for loss in (1.0, 2.0, 1e6):  # The third is a spike: one skip.
      _, on = guarded(2).update(grads, on, params, value=jnp.float32(loss))
    self.assertEqual(int(on.num_skipped), 1)
    off = on.inner_state

    # Switched off: the saved guard is restored, its inner state kept.
    target, convert = update_guard.restore_target(saved(on), abstract(off))
    self.assertEqual(jax.tree.structure(target), jax.tree.structure(on))
    jax.tree.map(np.testing.assert_array_equal, convert(on), off)
    # Switched on: the inner state as saved, a fresh guard.
    target, convert = update_guard.restore_target(
        saved(off), abstract(guarded(2).init(params)))
    self.assertEqual(jax.tree.structure(target), jax.tree.structure(off))
    fresh = convert(off)
    jax.tree.map(np.testing.assert_array_equal, fresh.inner_state, off)
    self.assertEqual((int(fresh.num_accepted), int(fresh.num_skipped)), (0, 0))
    np.testing.assert_array_equal(fresh.recent, np.zeros((2, 2)))
    # Resized window: the counts and inner state carry over, the window
    # starts again.
    target, convert = update_guard.restore_target(
        saved(on), abstract(guarded(5).init(params)))
    self.assertEqual(target.recent.shape, (2, 2))
    resized = convert(on)
    self.assertEqual(resized.recent.shape, (5, 2))
    self.assertEqual((int(resized.num_accepted), int(resized.num_skipped)),
                     (0, 1))
    jax.tree.map(np.testing.assert_array_equal, resized.inner_state, off)
    # Unchanged either way: restored as is.
    for state in (on, off):
      target, convert = update_guard.restore_target(saved(state),
                                                    abstract(state))
      self.assertEqual(jax.tree.structure(target), jax.tree.structure(state))
      self.assertIs(convert(state), state)

  def test_unguarded_state_has_no_metrics(self):
    self.assertEqual(
        update_guard.step_metrics(optax.adam(1e-3).init(_params())), {})

  def test_invalid_arguments(self):
    with self.assertRaisesRegex(ValueError, "spike_window=0"):
      update_guard.skip_bad_updates(optax.sgd(0.1), skip_nonfinite=True,
                                    spike_zscore=1.0, spike_window=0)


if __name__ == "__main__":
  absltest.main()
