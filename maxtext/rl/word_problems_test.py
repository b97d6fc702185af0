"""Tests of maxtext.rl.word_problems: each answer follows from its question,
the sets are deterministic with distinct questions, train and held-out share
none, and eval's maxtext_word_problems (maxtext_word_problems_easy) data is
the standard (easy) held-out set."""

import json
import os
import re

from absl.testing import absltest

from maxtext.rl import rewards
from maxtext.rl import word_problems

_TASKS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "eval",
    "tasks")


def _solve(question: str) -> int:
  """The answer, from the question's numbers and wording."""
  numbers = [int(n) for n in re.findall(r"\d+", question)]
  if "more" in question:
    return numbers[0] + numbers[1]
  if "packs" in question:
    return numbers[0] * numbers[1] - numbers[2]
  if "boxes" in question:
    return numbers[0] * numbers[1]
  return numbers[0] - numbers[1]


def _read(path: str) -> list[dict[str, str]]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f]


class WordProblemsTest(absltest.TestCase):

  def test_answers_follow_from_the_questions(self):
    for split, top in (("easy", 20), ("standard", 144)):
      records = word_problems.problems(split, 500)
      for record in records:
        self.assertEqual(int(record["answer"]), _solve(record["question"]),
                         record["question"])
        self.assertBetween(int(record["answer"]), 0, 2 * top)
        self.assertEqual(record["prompt"],
                         word_problems.prompt(record["question"]))
        self.assertIn("Question: " + record["question"], record["prompt"])
        # The reward reads the answer the prompt asks for.
        self.assertEqual(rewards.first_answer(
            [record["prompt"]], [f"so\n#### {record['answer']}\n\n#### 0"],
            answer=[record["answer"]]), [1.0])
      self.assertLen({r["question"] for r in records}, 500)
      self.assertEqual(records, word_problems.problems(split, 500))
    standard = word_problems.problems("standard", 400)
    self.assertTrue(any("packs" in r["question"] for r in standard))
    self.assertTrue(any("boxes" in r["question"] for r in standard))

  def test_train_and_heldout_share_no_question(self):
    folder = self.create_tempdir().full_path
    for split, train_count, heldout_count in word_problems.BUNDLED:
      train, heldout = (_read(p) for p in word_problems.write_split(folder,
                                                                    split))
      self.assertLen(train, train_count)
      self.assertLen(heldout, heldout_count)
      self.assertGreaterEqual(heldout_count, 200)
      self.assertEmpty({r["question"] for r in train} &
                       {r["question"] for r in heldout})

  def test_the_eval_tasks_data_are_the_heldout_sets(self):
    for task, split in (("maxtext_word_problems", "standard"),
                        ("maxtext_word_problems_easy", "easy")):
      _, heldout = word_problems.write_split(
          self.create_tempdir().full_path, split)
      self.assertEqual(
          _read(os.path.join(_TASKS, task, "heldout.jsonl")), _read(heldout),
          task)

  def test_an_unknown_split_is_named(self):
    with self.assertRaisesRegex(ValueError, r"split='hard' is invalid; valid:"
                                r" \('easy', 'standard'\)"):
      word_problems.problems("hard", 3)


if __name__ == "__main__":
  absltest.main()
