"""Tests DPO and ORPO on a tiny model and a separable toy preference set,
and the preference records' tokenization."""

import os

from absl.testing import absltest
import numpy as np

from maxtext.data import chat_template as chat_lib
from maxtext.data import tokenizer as tokenizer_lib
from maxtext.metrics import writers
from maxtext.posttrain import posttrain_testing as pt
from maxtext.posttrain import preference_data
from maxtext.posttrain import sft


def _preferences(count: int, offset: int = 0) -> list[dict[str, str]]:
  """Chosen and rejected words are functions of the prompt's words, from
  disjoint ranges: separable."""
  records = []
  for i in range(offset, offset + count):
    a, b = i % 8, 10 + (i // 8) % 4
    records.append({"prompt": f"{pt.word(a)} {pt.word(b)}",
                    "chosen": pt.word(20 + (a + b) % 10),
                    "rejected": pt.word(60 + (a * b) % 10)})
  return records


class DpoTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.folder = self.create_tempdir().full_path
    self.ckpt = pt.write_checkpoint(self.folder)
    self.train = pt.write_jsonl(os.path.join(self.folder, "train.jsonl"),
                                _preferences(32))

  def _config(self, method, steps):
    config = pt.dpo_test_config(self.folder, self.ckpt, steps=steps,
                                train_file=self.train, method=method)
    config.data.eval_files = pt.write_jsonl(
        os.path.join(self.folder, "eval.jsonl"), _preferences(16, 32))
    config.data.eval_every_steps = steps
    config.data.eval_steps = 2
    return config

  def test_dpo_preference_accuracy_rises(self):
    config = self._config("dpo", 20)
    config.optimizer.learning_rate = 1e-3
    workdir = os.path.join(self.folder, "dpo")
    result = sft.run(config, workdir)
    self.assertIsNotNone(result.trainer.ref_model)
    metrics = writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    start, end = metrics[1], metrics[20]
    print(f"DPO: train accuracy {start['train/rewards/accuracy']:.2f} ->"
          f" {end['train/rewards/accuracy']:.2f}, eval accuracy"
          f" {end['eval/rewards/accuracy']:.2f}, eval margin"
          f" {end['eval/rewards/margin']:.3f}")
    # The policy starts as the reference: every reward is 0.
    self.assertEqual(start["train/rewards/margin"], 0.0)
    self.assertGreater(end["train/rewards/accuracy"], 0.9)
    self.assertGreater(end["eval/rewards/accuracy"], 0.9)
    self.assertGreater(end["eval/rewards/margin"], 0.0)
    self.assertLess(end["train/loss"], start["train/loss"])

  def test_orpo_runs_without_a_reference(self):
    config = self._config("orpo", 10)
    config.optimizer.learning_rate = 1e-2
    workdir = os.path.join(self.folder, "orpo")
    result = sft.run(config, workdir)
    self.assertIsNone(result.trainer.ref_model)
    metrics = writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    print(f"ORPO: train/loss {metrics[1]['train/loss']:.3f} ->"
          f" {metrics[10]['train/loss']:.3f}, odds ratio"
          f" {metrics[10]['train/odds_ratio']:.3g}")
    self.assertLess(metrics[10]["train/loss"], metrics[1]["train/loss"] / 2)
    self.assertGreater(metrics[10]["eval/rewards/accuracy"], 0.9)
    self.assertTrue(os.path.isdir(result.exported["export"]))


class PreferenceDataTest(absltest.TestCase):

  def test_prompts_left_padded_responses_right_padded(self):
    path = os.path.join(self.create_tempdir().full_path, "tokenizer.json")
    pt.write_tokenizer(path)
    tokenizer = tokenizer_lib.load_tokenizer(path)
    chat = chat_lib.ChatEncoder(pt.TEMPLATE, tokenizer)
    pairs = preference_data.tokenize_pairs(
        [{"prompt": "w1 w2", "chosen": "w3", "rejected": "w4 w5 w6"},
         {"prompt": [{"role": "system", "content": "w7"},
                     {"role": "user", "content": "w8"}],
          "chosen": "w9", "rejected": "w10"}],
        chat, max_prompt_length=5, max_response_length=3)
    ids = {w: tokenizer.encode(w)[0] for w in pt.SPECIAL_WORDS}
    user, assistant, eos = ids["user"], ids["assistant"], ids["</s>"]
    # "user w1 w2 assistant" left-padded; then the assistant turns.
    np.testing.assert_array_equal(pairs.prompt_ids[0],
                                  [0, user, 1, 2, assistant])
    np.testing.assert_array_equal(pairs.prompt_mask[0], [0, 1, 1, 1, 1])
    np.testing.assert_array_equal(pairs.chosen_ids[0], [3, eos, 0])
    np.testing.assert_array_equal(pairs.chosen_mask[0], [1, 1, 0])
    # Truncated to its first 3 tokens.
    np.testing.assert_array_equal(pairs.rejected_ids[0], [4, 5, 6])
    # "system w7 user w8 assistant": the last 5 tokens of the prompt.
    np.testing.assert_array_equal(
        pairs.prompt_ids[1], [ids["system"], 7, user, 8, assistant])
    np.testing.assert_array_equal(pairs.rejected_ids[1], [10, eos, 0])
    with self.assertRaisesRegex(ValueError, "#0: a response is a int"):
      preference_data.tokenize_pairs(
          [{"prompt": "w1", "chosen": 3, "rejected": "w4"}], chat,
          max_prompt_length=4, max_response_length=4)


if __name__ == "__main__":
  absltest.main()
