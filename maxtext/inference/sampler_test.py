"""Tests of the token sampler against numpy computations of the filters."""

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from maxtext.inference import sampler


def _numpy_nucleus(logits_V: np.ndarray, temperature: float,
                   top_p: float) -> set[int]:
  """Fewest most likely tokens whose probabilities sum to >= top_p."""
  z = logits_V.astype(np.float64) / temperature
  probs = np.exp(z - z.max())
  probs /= probs.sum()
  order = np.argsort(-probs, kind="stable")
  before = np.cumsum(probs[order]) - probs[order]
  return set(order[before < top_p].tolist())


def _draws(logits_BV, params, num_keys, seed=0):
  keys = jax.random.split(jax.random.key(seed), num_keys)
  return np.asarray(jax.vmap(lambda k: sampler.sample(logits_BV, k, params))(
      keys))


class SamplerTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.logits_BV = jnp.asarray(
        np.random.RandomState(0).normal(0, 2.0, size=(8, 50)), jnp.float32)

  def test_greedy_is_argmax(self):
    got = sampler.sample(self.logits_BV, jax.random.key(0),
                         sampler.SamplingParams())
    np.testing.assert_array_equal(got, np.argmax(self.logits_BV, -1))

  def test_top_k_1_is_argmax(self):
    params = sampler.SamplingParams(temperature=5.0, top_k=1)
    draws = _draws(self.logits_BV, params, 20)
    np.testing.assert_array_equal(
        draws, np.broadcast_to(np.argmax(self.logits_BV, -1), draws.shape))

  def test_top_k_draws_only_the_k_most_likely(self):
    params = sampler.SamplingParams(temperature=3.0, top_k=4)
    draws = _draws(self.logits_BV, params, 200)
    top4 = np.argsort(-np.asarray(self.logits_BV), -1)[:, :4]
    for row in range(8):
      self.assertEqual(set(draws[:, row].tolist()), set(top4[row].tolist()))

  def test_top_p_draws_only_inside_the_nucleus(self):
    for temperature, top_p in ((0.7, 0.8), (1.5, 0.5), (1.0, 0.95)):
      params = sampler.SamplingParams(temperature=temperature, top_p=top_p)
      kept = np.isfinite(np.asarray(
          sampler.filtered_logits(self.logits_BV, params)))
      draws = _draws(self.logits_BV, params, 300)
      for row in range(8):
        nucleus = _numpy_nucleus(np.asarray(self.logits_BV[row]),
                                 temperature, top_p)
        self.assertEqual(set(np.flatnonzero(kept[row]).tolist()), nucleus)
        self.assertLessEqual(set(draws[:, row].tolist()), nucleus)
      # Not degenerate: some row draws several tokens.
      self.assertGreater(max(len(set(draws[:, r])) for r in range(8)), 1)

  def test_reproducible_by_key(self):
    params = sampler.SamplingParams(temperature=1.0, top_k=10, top_p=0.9)
    first = _draws(self.logits_BV, params, 10, seed=3)
    np.testing.assert_array_equal(_draws(self.logits_BV, params, 10, seed=3),
                                  first)
    self.assertFalse(np.array_equal(
        _draws(self.logits_BV, params, 10, seed=4), first))

  def test_validate(self):
    for bad, pattern in ((dict(temperature=-1.0), "temperature"),
                         (dict(top_k=-2), "top_k"),
                         (dict(top_p=1.5), "top_p")):
      with self.assertRaisesRegex(ValueError, pattern):
        sampler.SamplingParams(**bad).validate()


if __name__ == "__main__":
  absltest.main()
