"""Tests the eval binary end to end on a converted tiny Llama checkpoint:
the printed and written scores of the bundled tasks (and each generation)
and the perplexity equal those computed with transformers on the same
weights. Run with
HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 (the BUILD target sets them)."""

import contextlib
import io
import json
import math
import os
import re
import tempfile
from unittest import mock

# `datasets` (under lm-eval) caches in ~/.cache, read-only in Bazel's test
# sandbox; set before it is imported.
os.environ.setdefault("HF_HOME", os.path.join(
    os.environ.get("TEST_TMPDIR", tempfile.gettempdir()), "huggingface"))

from absl.testing import absltest
from absl.testing import flagsaver
import numpy as np

from maxtext.bin import eval as eval_bin
from maxtext.data import chat_template as chat_lib
from maxtext.data import tokenizer as tokenizer_lib
from maxtext.eval import harness
from maxtext.eval import hf_eval_reference
from testing import hf_tiny_models

_LIMIT = 6
_MAX_LENGTH = 256
_TEXTS = ["Friends, Romans, countrymen, lend me your ears;", "O Romeo!"]


class EvalBinaryTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.user_dir = self.create_tempdir().full_path
    self.hf_model, checkpoint = hf_eval_reference.converted_tiny_checkpoint(
        self.user_dir)
    self.tokenizer = tokenizer_lib.load_tokenizer(
        os.path.join(checkpoint, "tokenizer.json"))
    with open(os.path.join(self.user_dir, "docs.jsonl"), "w",
              encoding="utf-8") as f:
      f.writelines(json.dumps({"text": text}) + "\n" for text in _TEXTS)
    self.enter_context(mock.patch.dict(
        os.environ, {"BUILD_WORKING_DIRECTORY": self.user_dir}))

  def _run(self, **flag_values) -> str:
    stdout = io.StringIO()
    with flagsaver.flagsaver(**{"checkpoint": "converted",
                                "max_length": _MAX_LENGTH, **flag_values}):
      with contextlib.redirect_stdout(stdout):
        eval_bin.main(["eval"])
    return stdout.getvalue()

  def _hf_capitals_acc(self, docs) -> float:
    correct = []
    for doc in docs:
      context = self.tokenizer.encode(
          f"Question: What is the capital of {doc['country']}?\nAnswer:")
      scores = [hf_eval_reference.loglikelihood(
          self.hf_model, context, self.tokenizer.encode(" " + choice))[0]
                for choice in doc["choices"]]
      correct.append(int(np.argmax(scores)) == doc["answer"])
    return float(np.mean(correct))

  def test_scores_tasks_and_perplexity(self):
    printed = self._run(tasks=["maxtext_capitals", "maxtext_arithmetic"],
                        limit=_LIMIT, perplexity_data=["docs.jsonl"],
                        output="scores.json", log_samples=True)
    with open(os.path.join(self.user_dir, "scores.json"),
              encoding="utf-8") as f:
      scores = json.load(f)
    with open(os.path.join(harness.BUNDLED_TASKS_DIR, "maxtext_capitals",
                           "capitals.jsonl"), encoding="utf-8") as f:
      docs = [json.loads(line) for line in f][:_LIMIT]
    acc = scores["tasks"]["maxtext_capitals"]["acc,none"]
    self.assertEqual(acc, self._hf_capitals_acc(docs))
    matches = []
    for sample in scores["samples"]["maxtext_arithmetic"]:
      (context, gen_kwargs), = sample["arguments"]
      greedy = hf_tiny_models.hf_greedy(
          self.hf_model, self.tokenizer.encode(context),
          gen_kwargs["max_gen_toks"])
      greedy = greedy[:greedy.index(0)] if 0 in greedy else greedy  # EOS
      answer = self.tokenizer.decode(greedy).split("\n")[0]
      self.assertEqual(sample["resps"], [[answer]])
      matches.append(answer.strip() == sample["target"])
    self.assertLen(matches, _LIMIT)
    self.assertEqual(
        scores["tasks"]["maxtext_arithmetic"]["exact_match,strip"],
        np.mean(matches))
    nll = -sum(hf_eval_reference.rolling_loglikelihood(
        self.hf_model, self.tokenizer.encode(text), prefix_id=0,
        max_length=_MAX_LENGTH) for text in _TEXTS)
    tokens = sum(len(text) for text in _TEXTS)
    want = math.exp(nll / tokens)
    got = scores["perplexity"]["perplexity"]
    print(f"eval binary: acc {acc}, perplexity {got:.5f} vs transformers'"
          f" {want:.5f}")
    self.assertAlmostEqual(got, want, delta=1e-5 * want)
    self.assertIn("|maxtext_capitals  |      1|none  |     0|acc", printed)
    # The printed figure is ours (transformers' may round to another last
    # digit: 189.22735 against 189.22737 printed .2273 and .2274).
    self.assertIn(f"perplexity: {got:.4f} ({tokens} tokens in 2 documents)",
                  printed)

  def test_word_problems_with_a_chat_template(self):
    self._run(tasks=["maxtext_word_problems"], limit=3, chat_template="chatml",
              output="chat.json", log_samples=True)
    with open(os.path.join(self.user_dir, "chat.json"),
              encoding="utf-8") as f:
      scores = json.load(f)
    chat = chat_lib.ChatEncoder(chat_lib.load_template("chatml"),
                                self.tokenizer)
    matches = []
    for sample in scores["samples"]["maxtext_word_problems"]:
      (context, gen_kwargs), = sample["arguments"]
      # The request is the problem as a user turn, ready for the answer.
      self.assertEqual(context, chat.render(
          [{"role": "user", "content": sample["doc"]["prompt"]}],
          add_generation_prompt=True))
      # The prompt keeps its last max_length - max_gen_toks tokens.
      kept = _MAX_LENGTH - gen_kwargs["max_gen_toks"]
      greedy = hf_tiny_models.hf_greedy(
          self.hf_model, self.tokenizer.encode(context)[-kept:],
          gen_kwargs["max_gen_toks"])
      greedy = greedy[:greedy.index(0)] if 0 in greedy else greedy  # EOS
      answer = self.tokenizer.decode(greedy)
      for stop in gen_kwargs["until"]:
        answer = answer.split(stop)[0]
      self.assertEqual(sample["resps"], [[answer]])
      final = re.findall(r"####\s*(-?[0-9][0-9,]*)", answer)
      matches.append(bool(final) and final[0] == sample["target"])
    self.assertLen(matches, 3)
    self.assertEqual(
        scores["tasks"]["maxtext_word_problems"]["exact_match,final_answer"],
        np.mean(matches))

  def test_needs_tasks_or_perplexity_data(self):
    with self.assertRaisesRegex(Exception, "--tasks, --perplexity_data"):
      self._run(tasks=[])

  def test_user_mistakes_are_one_line(self):
    for flag_values, message in (
        (dict(checkpoint="missing"), r"missing"),
        (dict(tasks=[], perplexity_data=["nothing*.jsonl"]),
         r"nothing\*\.jsonl"),
        (dict(chat_template="nothing.jinja"),
         r"--chat_template='.*nothing.jinja' is neither a built-in"),
    ):
      with self.subTest(flag_values), self.assertRaisesRegex(
          SystemExit, r"^eval: error: \w+: [^\n]*" + message):
        self._run(**flag_values)


if __name__ == "__main__":
  absltest.main()
