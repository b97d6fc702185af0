"""Tests batched scoring against transformers on the same converted weights:
continuation log-likelihoods (with truncation to max_length and a padded
last batch) and whole documents in rolling windows."""

import tempfile

from absl.testing import absltest
import numpy as np

from maxtext.checkpoint import params_checkpoint
from maxtext.eval import hf_eval_reference
from maxtext.eval import scoring
from testing import hf_tiny_models

_MAX_LENGTH = 24


class ScoringTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    folder = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    cls.hf_model, checkpoint = hf_eval_reference.converted_tiny_checkpoint(
        folder)
    cls.model = params_checkpoint.model_from_params(
        *params_checkpoint.load_params(checkpoint))
    cls.rng = np.random.default_rng(0)

  def _tokens(self, n):
    return self.rng.integers(1, 128, n).tolist()

  def test_score_matches_transformers(self):
    # Lengths below, at and above max_length; 5 requests in batches of 3.
    requests = [(self._tokens(c), self._tokens(n))
                for c, n in [(1, 1), (5, 3), (20, 4), (30, 6), (2, 24)]]
    scorer = scoring.Scorer(self.model, max_length=_MAX_LENGTH, batch_size=3)
    got = scorer.score(requests)
    diffs = []
    for (context, continuation), (logprob, greedy) in zip(requests, got):
      # The model sees the last max_length + 1 tokens (minus the last one).
      kept = (context + continuation)[-(_MAX_LENGTH + 1):]
      want, want_greedy = hf_eval_reference.loglikelihood(
          self.hf_model, kept[:-len(continuation)], continuation)
      diffs.append(abs(logprob - want))
      self.assertEqual(greedy, want_greedy)
    print(f"score: max |sum log-prob diff| = {max(diffs):.3g}")
    self.assertLessEqual(max(diffs), 1e-4)

  def test_greedy_flag_is_true_for_the_model_s_own_argmax(self):
    context = self._tokens(6)
    scorer = scoring.Scorer(self.model, max_length=_MAX_LENGTH, batch_size=2)
    greedy = hf_tiny_models.hf_greedy(self.hf_model, context, 3)
    other = [(greedy[0] + 1) % 128] + greedy[1:]
    (_, is_greedy), (_, other_greedy) = scorer.score(
        [(context, greedy), (context, other)])
    self.assertTrue(is_greedy)
    self.assertFalse(other_greedy)

  def test_score_rolling_matches_transformers_windows(self):
    documents = [self._tokens(n) for n in (1, 10, _MAX_LENGTH,
                                           _MAX_LENGTH + 1, 61)]
    scorer = scoring.Scorer(self.model, max_length=_MAX_LENGTH, batch_size=4)
    got = scorer.score_rolling(documents, prefix_id=0)
    want = [hf_eval_reference.rolling_loglikelihood(
        self.hf_model, document, prefix_id=0, max_length=_MAX_LENGTH)
            for document in documents]
    diff = float(np.max(np.abs(np.subtract(got, want))))
    print(f"score_rolling: max |log-likelihood diff| = {diff:.3g}")
    self.assertLessEqual(diff, 1e-4)

  def test_rolling_windows_predict_every_token_once(self):
    tokens = list(range(1, 62))
    windows = scoring.rolling_windows(tokens, prefix_id=0, max_length=8)
    self.assertEqual(sum((c for _, c in windows), []), tokens)
    self.assertEqual(windows[0], ([0], tokens[:8]))
    for context, continuation in windows:
      self.assertLessEqual(len(context) + len(continuation), 9)

  def test_bad_requests_are_refused(self):
    scorer = scoring.Scorer(self.model, max_length=8, batch_size=2)
    with self.assertRaisesRegex(ValueError, "Request 1 has 0 context"):
      scorer.score([([1], [2]), ([], [3])])
    with self.assertRaisesRegex(ValueError, "9 tokens, more than max_length"):
      scorer.score([([1], list(range(9)))])
    with self.assertRaisesRegex(ValueError, "Document 0 has no tokens"):
      scorer.score_rolling([[]], prefix_id=0)
    with self.assertRaisesRegex(ValueError, "batch_size=0"):
      scoring.Scorer(self.model, max_length=8, batch_size=0)


if __name__ == "__main__":
  absltest.main()
