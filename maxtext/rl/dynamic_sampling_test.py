"""Tests of maxtext.rl.dynamic_sampling on hand-made rollout batches: the
informative groups kept in order, refilled from further batches up to the
round limit, uninformative ones filling the rest, shapes unchanged."""

from absl.testing import absltest
import numpy as np
from tunix.rl.grpo import grpo_learner

from maxtext.rl import dynamic_sampling

_G = 2  # Completions per group.


def _batch(tag: int, advantages) -> grpo_learner.TrainExample:
  """A batch of len(advantages) / 2 groups; every row's prompt ids name its
  batch and row (tag * 100 + row)."""
  rows = len(advantages)
  ids = (tag * 100 + np.arange(rows))[:, None] * np.ones((1, 3), np.int32)
  return grpo_learner.TrainExample(
      prompt_ids=ids.astype(np.int32), prompt_mask=np.ones((rows, 3), bool),
      completion_ids=ids[:, :2].astype(np.int32),
      completion_mask=np.ones((rows, 2), bool),
      advantages=np.asarray(advantages, np.float32),
      ref_per_token_logps=None, old_per_token_logps=None)


class DynamicSamplingTest(absltest.TestCase):

  def _fill(self, first, batches, max_rounds):
    sampled = iter(batches)
    calls = []

    def more():
      calls.append(1)
      return next(sampled)

    batch, stats = dynamic_sampling.keep_informative(
        first, more, generations=_G, max_rounds=max_rounds)
    return batch, stats, len(calls)

  def test_informative_groups_refill_the_batch(self):
    # Groups: 0 informative, 1 all equal (zero advantages), 2 informative.
    first = _batch(1, [0.5, -0.5, 0.0, 0.0, 1.0, -1.0])
    second = _batch(2, [0.0, 0.0, 0.3, -0.3, 0.2, -0.2])
    batch, stats, calls = self._fill(first, [second], max_rounds=3)
    self.assertEqual(calls, 1)  # Full after one more batch.
    # Batch 1's groups 0 and 2, then batch 2's group 1.
    np.testing.assert_array_equal(batch.prompt_ids[:, 0],
                                  [100, 101, 104, 105, 202, 203])
    np.testing.assert_array_equal(
        batch.advantages,
        np.float32([0.5, -0.5, 1.0, -1.0, 0.3, -0.3]))
    self.assertEqual(batch.completion_ids.shape, first.completion_ids.shape)
    self.assertIsNone(batch.ref_per_token_logps)
    self.assertEqual(stats, {"dynamic_sampling/rounds": 2.0,
                             "dynamic_sampling/informative": 2 / 3,
                             "dynamic_sampling/filled": 1.0})

  def test_rounds_run_out_and_uninformative_groups_fill_the_rest(self):
    first = _batch(1, [0.0, 0.0, 0.0, 0.0, 1.0, -1.0])
    dull = _batch(2, [0.0] * 6)
    batch, stats, calls = self._fill(first, [dull, dull], max_rounds=2)
    self.assertEqual(calls, 1)
    np.testing.assert_array_equal(batch.prompt_ids[:, 0],
                                  [104, 105, 100, 101, 102, 103])
    self.assertEqual(stats["dynamic_sampling/filled"], 1 / 3)

  def test_a_full_batch_samples_nothing_more(self):
    first = _batch(1, [0.1, -0.1, 0.2, -0.2])
    batch, stats, calls = self._fill(first, [], max_rounds=4)
    self.assertEqual(calls, 0)
    np.testing.assert_array_equal(batch.advantages, first.advantages)
    self.assertEqual(stats["dynamic_sampling/rounds"], 1.0)


if __name__ == "__main__":
  absltest.main()
