"""The gated delta rule: the token-by-token reference against numpy's loop
of the published recurrence; the chunked form against the reference."""

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from maxtext.kernels import gated_delta_rule
from testing import trees


def _inputs(seed, batch=2, length=37, heads=3, key_dim=8, value_dim=6):
  rng = np.random.default_rng(seed)
  q, k = (rng.normal(size=(batch, length, heads, key_dim)) for _ in range(2))
  q, k = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in (q, k))
  v = rng.normal(size=(batch, length, heads, value_dim))
  g = -np.abs(rng.normal(size=(batch, length, heads))) * 0.5
  beta = 1 / (1 + np.exp(-rng.normal(size=(batch, length, heads))))
  return [x.astype(np.float32) for x in (q * key_dim**-0.5, k, v, g, beta)]


def _numpy_rule(q, k, v, g, beta, segment_ids=None, state=None):
  """Gated DeltaNet's recurrence (Yang et al. 2024, eq. 10), token by
  token: S <- exp(g) S; S <- S + k (beta (v - S^T k))^T; o = S^T q."""
  batch, length, heads, key_dim = q.shape
  out = np.zeros(v.shape, np.float64)
  states = np.zeros((batch, heads, key_dim, v.shape[-1]))
  for b in range(batch):
    s = np.zeros((heads, key_dim, v.shape[-1])) if state is None else (
        state[b].astype(np.float64))
    for t in range(length):
      if segment_ids is not None and t and (
          segment_ids[b, t] != segment_ids[b, t - 1]):
        s = np.zeros_like(s)
      s = s * np.exp(g[b, t])[:, None, None]
      recalled = np.einsum("hku,hk->hu", s, k[b, t])
      s = s + np.einsum("hk,hu->hku", k[b, t],
                        (v[b, t] - recalled) * beta[b, t][:, None])
      out[b, t] = np.einsum("hku,hk->hu", s, q[b, t])
    states[b] = s
  return out, states


def _segments(batch, length):
  ids = np.zeros((batch, length), np.int32)
  ids[:, 10:] = 1
  ids[:, 25:] = 2
  ids[1, 30:] = 3
  ids[1, 31:] = 4  # A one-token document.
  return ids


class GatedDeltaRuleTest(parameterized.TestCase):

  @parameterized.parameters(False, True)
  def test_reference_is_the_published_recurrence(self, packed):
    args = _inputs(0)
    segment_ids = _segments(*args[0].shape[:2]) if packed else None
    out, state = gated_delta_rule.reference(*args,
                                            segment_ids_BL=segment_ids)
    want_out, want_state = _numpy_rule(*args, segment_ids=segment_ids)
    np.testing.assert_allclose(out, want_out, atol=1e-5)
    np.testing.assert_allclose(state, want_state, atol=1e-5)

  # Lengths below, at and past a chunk, not multiples of it.
  @parameterized.parameters((1, 5, True), (4, 37, True), (16, 70, True),
                            (64, 37, True), (64, 70, False), (16, 1, False))
  def test_chunked_equals_reference(self, chunk, length, packed):
    args = _inputs(1, length=length)
    segment_ids = _segments(2, length) if packed else None
    want = gated_delta_rule.reference(*args, segment_ids_BL=segment_ids)
    got = gated_delta_rule.chunked(*args, chunk=chunk,
                                   segment_ids_BL=segment_ids)
    for g, w in zip(got, want):
      np.testing.assert_allclose(g, w, atol=2e-5)

  @parameterized.parameters(1, 2, 3, 17, 64)
  def test_unit_lower_inverse_equals_numpy(self, size):
    a = np.tril(np.random.default_rng(size).normal(
        size=(2, size, size)), -1).astype(np.float32) * 0.5
    want = np.linalg.inv(np.eye(size) + a.astype(np.float64))
    # Entries grow with the size (to ~500 at 64, products along paths of
    # the triangle) and cancel: within 1e-5 of the largest magnitude.
    trees.assert_close(gated_delta_rule.unit_lower_inverse(a), want,
                       rtol=1e-4, atol=1e-4, scaled_atol=1e-5)

  def test_packed_documents_equal_separate_rows(self):
    args = _inputs(2, length=40)
    segment_ids = np.repeat([[0] * 13 + [1] * 27], 2, axis=0)
    out, _ = gated_delta_rule.chunked(*args, chunk=8,
                                      segment_ids_BL=segment_ids)
    for start, stop in ((0, 13), (13, 40)):
      alone, _ = gated_delta_rule.chunked(
          *(x[:, start:stop] for x in args), chunk=8)
      np.testing.assert_allclose(out[:, start:stop], alone, atol=2e-5)

  @parameterized.parameters(1, 8)
  def test_initial_state_continues_a_sequence(self, chunk):
    args = _inputs(3, length=30)
    whole, whole_state = gated_delta_rule.chunked(*args, chunk=chunk)
    _, state = gated_delta_rule.chunked(*(x[:, :17] for x in args),
                                        chunk=chunk)
    rest, rest_state = gated_delta_rule.chunked(
        *(x[:, 17:] for x in args), chunk=chunk, state_BHKU=state)
    np.testing.assert_allclose(rest, whole[:, 17:], atol=2e-5)
    np.testing.assert_allclose(rest_state, whole_state, atol=2e-5)
    # The recurrent form, one token at a time, from the same state.
    for t in range(17, 30):
      out, state = gated_delta_rule.step(state, *(x[:, t] for x in args))
      np.testing.assert_allclose(out, whole[:, t], atol=2e-5)


if __name__ == "__main__":
  absltest.main()
