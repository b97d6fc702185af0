"""Tests of the attention kernels: reference == naive loop == xla."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from maxtext.kernels import attention
from maxtext.kernels import dispatch
from maxtext.kernels import kernel_testing

_B, _L, _K = 2, 10, 8


def _segments():
  return np.array([[1, 1, 1, 2, 2, 2, 2, 3, 3, 0],
                   [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]], np.int32)


def _naive_attention(q, k, v, scale, window, segment_ids, softcap,
                     sinks=None):
  """One query at a time, keys chosen by explicit rules; a head's sink
  logit adds exp(sink) to its softmax denominator."""
  out = np.zeros_like(q)
  group = q.shape[2] // k.shape[2]
  for b in range(q.shape[0]):
    for i in range(q.shape[1]):
      keys = [j for j in range(i + 1)
              if (window is None or i - j < window) and
              (segment_ids is None or segment_ids[b, i] == segment_ids[b, j])]
      for h in range(q.shape[2]):
        logits = np.array([q[b, i, h] @ k[b, j, h // group] for j in keys])
        logits = logits * scale
        if softcap:
          logits = softcap * np.tanh(logits / softcap)
        top = logits.max() if sinks is None else max(logits.max(), sinks[h])
        probs = np.exp(logits - top)
        sink = 0.0 if sinks is None else np.exp(sinks[h] - top)
        probs /= probs.sum() + sink
        out[b, i, h] = probs @ v[b, keys, h // group]
  return out


_CASES = [
    dict(testcase_name=f"h{h}_g{g}_w{w}_seg{seg}", num_heads=h,
         num_kv_heads=g, window=w, segments=seg)
    for h, g in ((4, 4), (4, 2), (4, 1))
    for w in (None, 3)
    for seg in (False, True)
]


class AttentionTest(parameterized.TestCase):

  @parameterized.named_parameters(*_CASES)
  def test_reference_matches_naive_loop(self, num_heads, num_kv_heads, window,
                                        segments):
    q, k, v = kernel_testing.inputs(_B, _L, num_heads, num_kv_heads, _K)
    segment_ids = _segments() if segments else None
    got = attention.reference_attention(
        q, k, v, scale=0.3, window=window, segment_ids_BL=segment_ids)
    want = _naive_attention(q, k, v, 0.3, window, segment_ids, 0.0)
    np.testing.assert_allclose(got, want, atol=1e-5)

  def test_reference_softcap_matches_naive_loop(self):
    q, k, v = kernel_testing.inputs(_B, _L, 4, 2, _K)
    got = attention.reference_attention(q, k, v, scale=1.0, window=4,
                                        logit_softcap=2.0)
    want = _naive_attention(q, k, v, 1.0, 4, None, 2.0)
    np.testing.assert_allclose(got, want, atol=1e-5)
    uncapped = attention.reference_attention(q, k, v, scale=1.0, window=4)
    self.assertGreater(np.abs(got - uncapped).max(), 1e-2)

  @parameterized.named_parameters(*_CASES)
  def test_reference_sinks_match_naive_loop(self, num_heads, num_kv_heads,
                                            window, segments):
    q, k, v = kernel_testing.inputs(_B, _L, num_heads, num_kv_heads, _K,
                                    seed=2)
    segment_ids = _segments() if segments else None
    sinks = np.linspace(-1.0, 2.0, num_heads).astype(np.float32)
    got = attention.reference_attention(
        q, k, v, scale=0.3, window=window, segment_ids_BL=segment_ids,
        sinks_H=sinks)
    want = _naive_attention(q, k, v, 0.3, window, segment_ids, 0.0, sinks)
    np.testing.assert_allclose(got, want, atol=1e-5)
    # The sinks matter (the test is not vacuous).
    without = attention.reference_attention(
        q, k, v, scale=0.3, window=window, segment_ids_BL=segment_ids)
    self.assertGreater(np.abs(got - without).max(), 1e-2)

  def test_sinks_apply_with_an_explicit_mask(self):
    q, k, v = kernel_testing.inputs(_B, _L, 4, 2, _K)
    sinks = np.array([0.5, -0.5, 1.0, 0.0], np.float32)
    positions = np.broadcast_to(np.arange(_L), q.shape[:2])
    mask = attention.positions_mask(positions, _L, 3)
    np.testing.assert_allclose(
        attention.reference_attention(q, k, v, scale=0.3, mask_BLS=mask,
                                      sinks_H=sinks),
        _naive_attention(q, k, v, 0.3, 3, None, 0.0, sinks), atol=1e-5)

  def test_xla_rejects_sinks(self):
    q, k, v = kernel_testing.inputs(_B, _L, 4, 2, _K)
    with self.assertRaisesRegex(ValueError, "sinks"):
      attention.xla_attention(q, k, v, scale=1.0, sinks_H=np.zeros(4))

  @parameterized.named_parameters(*_CASES)
  def test_xla_matches_reference(self, num_heads, num_kv_heads, window,
                                 segments):
    q, k, v = kernel_testing.inputs(_B, _L, num_heads, num_kv_heads, _K,
                                    seed=1)
    segment_ids = _segments() if segments else None
    kwargs = dict(scale=0.3, window=window, segment_ids_BL=segment_ids)
    want = attention.reference_attention(q, k, v, **kwargs)
    got = jax.jit(lambda q, k, v: attention.xla_attention(q, k, v, **kwargs))(
        q, k, v)
    np.testing.assert_allclose(got, want, atol=1e-5)

  def test_xla_rejects_softcap(self):
    q, k, v = kernel_testing.inputs(_B, _L, 4, 2, _K)
    with self.assertRaisesRegex(ValueError, "soft-cap"):
      attention.xla_attention(q, k, v, scale=1.0, logit_softcap=50.0)

  @parameterized.parameters(*attention.IMPLEMENTATIONS)
  def test_keys_outside_the_window_have_no_influence(self, impl):
    kernel = attention.IMPLEMENTATIONS[impl]
    q, k, v = kernel_testing.inputs(_B, _L, 4, 2, _K)
    window, query = 3, _L - 1
    out = kernel(q, k, v, scale=0.3, window=window)
    k2, v2 = k.copy(), v.copy()
    far = slice(0, query - window + 1)  # keys j with query - j >= window
    k2[:, far] += 5.0
    v2[:, far] -= 5.0
    out2 = kernel(q, k2, v2, scale=0.3, window=window)
    np.testing.assert_array_equal(out[:, query], out2[:, query])
    # The last key inside the window does matter.
    v2[:, query - window + 1] += 1.0
    out3 = kernel(q, k2, v2, scale=0.3, window=window)
    self.assertGreater(np.abs(out3[:, query] - out[:, query]).max(), 1e-3)

  def test_implementations_are_config_choices(self):
    self.assertLess(set(attention.IMPLEMENTATIONS), set(dispatch.IMPLS))


class PositionsMaskTest(parameterized.TestCase):

  @parameterized.product(impl=("reference", "xla"), window=(None, 3))
  def test_positions_mask_over_all_positions_is_the_causal_mask(self, impl,
                                                                window):
    q, k, v = kernel_testing.inputs(_B, _L, 4, 2, _K)
    length = q.shape[1]
    positions = np.broadcast_to(np.arange(length), q.shape[:2])
    mask = attention.positions_mask(positions, length, window)
    kernel = attention.IMPLEMENTATIONS[impl]
    np.testing.assert_allclose(
        kernel(q, k, v, scale=0.3, mask_BLS=mask),
        kernel(q, k, v, scale=0.3, window=window), rtol=0, atol=1e-6)

  @parameterized.parameters("reference", "xla")
  def test_chunks_as_segment_ids_equal_the_chunked_positions_mask(self,
                                                                  impl):
    """Chunked attention (Llama 4) run as packed segments equals the mask
    of positions in one chunk; with packed documents each restarts its
    chunks at its own position 0."""
    q, k, v = kernel_testing.inputs(_B, _L, 4, 2, _K)
    length = q.shape[1]
    positions = np.broadcast_to(np.arange(length), q.shape[:2])
    kernel = attention.IMPLEMENTATIONS[impl]
    chunked = attention.chunk_segment_ids(positions, 3)
    np.testing.assert_allclose(
        kernel(q, k, v, scale=0.3, segment_ids_BL=chunked),
        kernel(q, k, v, scale=0.3,
               mask_BLS=attention.positions_mask(positions, length,
                                                 chunk=3)),
        rtol=0, atol=1e-6)
    # Documents of 5 and length - 5 tokens in every row.
    segments = np.broadcast_to(np.arange(length) >= 5, q.shape[:2]) + 1
    doc_positions = np.where(segments == 1, np.arange(length),
                             np.arange(length) - 5)
    ids = np.asarray(attention.chunk_segment_ids(doc_positions, 3, segments))
    want = (segments * 100 + doc_positions // 3)[0]
    same = ids[0][:, None] == ids[0][None, :]
    np.testing.assert_array_equal(same, want[:, None] == want[None, :])

  def test_mask_excludes_window_and_segments(self):
    q, k, v = kernel_testing.inputs(_B, _L, 4, 2, _K)
    mask = attention.positions_mask(np.zeros((2, 1), np.int32), 4)
    with self.assertRaisesRegex(ValueError, "not both"):
      attention.reference_attention(q, k, v, scale=1.0, window=2,
                                    mask_BLS=mask)


if __name__ == "__main__":
  absltest.main()
