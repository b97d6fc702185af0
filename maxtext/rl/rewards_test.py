"""Tests of the reward functions on hand-made completions."""

from absl.testing import absltest

from maxtext.rl import rewards


def custom_reward(prompts, completions, **unused):
  """A reward of this module, referenced as "module:function"."""
  del unused
  return [float(len(p) < len(c)) for p, c in zip(prompts, completions)]


class RewardsTest(absltest.TestCase):

  def test_exact_answer(self):
    completions = ["so 3 + 4 = 7\n#### 7", "#### 1,234", "#### 8",
                   "the answer is 7", "#### 7.0 ", "#### 2 then #### 5"]
    answers = ["7", "1234", "7", "7", "Janet has ... #### 7", "5"]
    self.assertEqual(
        rewards.exact_answer([""] * 6, completions, answer=answers),
        [1.0, 1.0, 0.0, 0.0, 1.0, 1.0])

  def test_first_answer(self):
    completions = ["4 + 3 = 7. #### 7\n\nQuestion: #### 9", "#### 6 #### 7",
                   "no answer", "#### 1,234"]
    self.assertEqual(
        rewards.first_answer([""] * 4, completions,
                             answer=["7", "7", "7", "1234"]),
        [1.0, 0.0, 0.0, 1.0])
    self.assertEqual(rewards.exact_answer([""], completions[:1],
                                          answer=["7"]), [0.0])

  def test_answer_format(self):
    completions = ["#### 7", "work\n#### -12", "#### 7 and more", "7",
                   "####", "#### 3,000.5  "]
    self.assertEqual(rewards.answer_format([""] * 6, completions),
                     [1.0, 1.0, 0.0, 0.0, 0.0, 1.0])

  def test_length_penalty(self):
    self.assertEqual(
        rewards.length_penalty(["", "", ""], ["a b", "a b c d", ""],
                               max_words=2),
        [0.0, -1.0, 0.0])
    self.assertEqual(rewards.length_penalty([""], ["w " * 20])[0],
                     -4 / 16)

  def test_overlong_penalty_is_dapos_formula(self):
    """Yu et al. 2025, eq. 13 with L_max 10 and L_cache 4."""
    lengths = [0, 5, 6, 7, 9, 10, 11]

    def want(length):
      if length <= 10 - 4:
        return 0.0
      return (10 - 4 - length) / 4 if length <= 10 else -1.0

    got = rewards.overlong_penalty([""] * 7, ["c"] * 7,
                                   completion_lengths=lengths, max_length=10,
                                   buffer=4)
    self.assertEqual(got, [want(n) for n in lengths])
    self.assertEqual(got[2:6], [0.0, -0.25, -0.75, -1.0])
    latest = [[3, 12]]
    (fn,) = rewards.make_reward_fns((("overlong_penalty", 0.5),),
                                    max_length=12, overlong_buffer=6,
                                    completion_lengths=lambda: latest[0])
    self.assertEqual(fn(["", ""], ["a", "b"]), [0.0, -0.5])
    latest[0] = [9, 6]  # Read again at each call: the latest rollout's.
    self.assertEqual(fn(["", ""], ["a", "b"]), [-0.25, 0.0])
    with self.assertRaisesRegex(ValueError, "needs the rollout's completion"):
      rewards.make_reward_fns((("overlong_penalty", 1.0),))

  def test_weighted_rewards_are_named_and_summed_by_the_learner(self):
    fns = rewards.make_reward_fns(
        (("exact_answer", 2.0), ("answer_format", 0.5),
         ("length_penalty", 1.0),
         (f"{__name__}:custom_reward", 3.0)), max_words=1)
    self.assertEqual([f.__name__ for f in fns],
                     ["exact_answer", "answer_format", "length_penalty",
                      "custom_reward"])
    completions = ["#### 7", "#### 6", "no"]
    values = [fn(["p1", "p2", "p3"], completions, answer=["7", "7", "7"])
              for fn in fns]
    self.assertEqual(values, [[2.0, 0.0, 0.0], [0.5, 0.5, 0.0],
                              [-1.0, -1.0, 0.0], [3.0, 3.0, 0.0]])

  def test_unknown_rewards_are_errors(self):
    with self.assertRaisesRegex(ValueError, "'exact' is unknown.*"
                                "exact_answer"):
      rewards.make_reward_fns((("exact", 1.0),))
    with self.assertRaisesRegex(ValueError, "cannot be imported"):
      rewards.make_reward_fns((("maxtext.rl.rewards:nothing", 1.0),))
    with self.assertRaisesRegex(ValueError, "rl.rewards is empty"):
      rewards.make_reward_fns(())


if __name__ == "__main__":
  absltest.main()
