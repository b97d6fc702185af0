"""Tests our lm-eval model on the bundled tasks against transformers on the
same converted weights: each multiple-choice log-likelihood and the accuracy,
each greedy generation and the exact-match score, and rolling
log-likelihoods. Run with HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 (the BUILD
target sets them): the tasks read local JSONL files only."""

import json
import os
import tempfile

# `datasets` (under lm-eval) caches in ~/.cache, read-only in Bazel's test
# sandbox; set before it is imported.
os.environ.setdefault("HF_HOME", os.path.join(
    os.environ.get("TEST_TMPDIR", tempfile.gettempdir()), "huggingface"))

from absl.testing import absltest
from lm_eval.api import instance
import lm_eval
import numpy as np

from maxtext.data import assets
from maxtext.data import tokenizer as tokenizer_lib
from maxtext.eval import harness
from maxtext.eval import hf_eval_reference
from maxtext.eval import lm_eval_adapter
from testing import hf_tiny_models

_MAX_LENGTH = 128
_BATCH_SIZE = 8


def _encode_pair(tokenizer, context: str, continuation: str):
  """lm-eval's split of a request into token ids: trailing spaces of the
  context belong to the continuation."""
  spaces = len(context) - len(context.rstrip())
  if spaces:
    context, continuation = context[:-spaces], context[-spaces:] + continuation
  whole = tokenizer.encode(context + continuation)
  context_ids = tokenizer.encode(context)
  return context_ids, whole[len(context_ids):]


class MaxTextLMTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    folder = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    cls.hf_model, cls.checkpoint = (
        hf_eval_reference.converted_tiny_checkpoint(folder))
    cls.lm = lm_eval_adapter.MaxTextLM.from_checkpoint(
        cls.checkpoint, max_length=_MAX_LENGTH, batch_size=_BATCH_SIZE)

  def test_multiple_choice_matches_transformers(self):
    results = harness.evaluate(self.lm, ["maxtext_capitals"], log_samples=True)
    samples = results["samples"]["maxtext_capitals"]
    self.assertLen(samples, 20)
    tokenizer = self.lm.text_tokenizer
    diffs, correct = [], []
    for sample in samples:
      want = []
      for (context, continuation), (got, got_greedy) in zip(
          sample["arguments"], sample["filtered_resps"]):
        logprob, greedy = hf_eval_reference.loglikelihood(
            self.hf_model, *_encode_pair(tokenizer, context, continuation))
        diffs.append(abs(got - logprob))
        self.assertEqual(got_greedy, greedy)
        want.append(logprob)
      correct.append(int(np.argmax(want)) == sample["doc"]["answer"])
    print(f"maxtext_capitals: {len(diffs)} log-likelihoods, max |diff| ="
          f" {max(diffs):.3g}; acc {np.mean(correct)}")
    self.assertLessEqual(max(diffs), 1e-4)
    self.assertAlmostEqual(
        harness.scores(results)["maxtext_capitals"]["acc,none"],
        np.mean(correct))

  def test_generation_matches_transformers_greedy(self):
    results = harness.evaluate(self.lm, ["maxtext_arithmetic"],
                               log_samples=True)
    samples = results["samples"]["maxtext_arithmetic"]
    self.assertLen(samples, 20)
    tokenizer = self.lm.text_tokenizer
    matches = []
    for sample in samples:
      (context, gen_kwargs), = sample["arguments"]
      self.assertEqual(gen_kwargs["until"], ["\n"])
      # The prompt keeps its last max_length - max_gen_toks tokens (the
      # few-shot prompts are longer).
      max_new = gen_kwargs["max_gen_toks"]
      prompt = tokenizer.encode(context)[-(_MAX_LENGTH - max_new):]
      greedy = hf_tiny_models.hf_greedy(self.hf_model, prompt, max_new)
      eos = tokenizer.eos_id  # We stop at EOS; transformers here does not.
      greedy = greedy[:greedy.index(eos)] if eos in greedy else greedy
      want = tokenizer.decode(greedy).split("\n")[0]
      self.assertEqual(sample["resps"], [[want]])
      matches.append(want.strip() == sample["target"])
    self.assertEqual(
        harness.scores(results)["maxtext_arithmetic"]["exact_match,strip"],
        np.mean(matches))

  def test_loglikelihood_rolling_matches_transformers(self):
    texts = ["To be, or not to be, that is the question:\n" * 4, "Hi"]
    requests = [instance.Instance("loglikelihood_rolling", doc={},
                                  arguments=(text,), idx=0) for text in texts]
    got = self.lm.loglikelihood_rolling(requests)
    eos = self.lm.text_tokenizer.eos_id
    self.assertGreater(len(texts[0]), _MAX_LENGTH)  # Several windows.
    want = [hf_eval_reference.rolling_loglikelihood(
        self.hf_model, self.lm.text_tokenizer.encode(text), prefix_id=eos,
        max_length=_MAX_LENGTH) for text in texts]
    # Sums over every token of the texts: within 1e-5 relative.
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5)

  def test_registered_name_loads_a_checkpoint(self):
    by_name = lm_eval.simple_evaluate(
        model="maxtext", model_args=f"checkpoint={self.checkpoint},"
        f"max_length={_MAX_LENGTH}", batch_size=_BATCH_SIZE,
        tasks=["maxtext_capitals"], limit=4, log_samples=True,
        task_manager=harness.task_manager())
    direct = harness.evaluate(self.lm, ["maxtext_capitals"], limit=4,
                              log_samples=True)
    self.assertEqual(
        [s["filtered_resps"] for s in by_name["samples"]["maxtext_capitals"]],
        [s["filtered_resps"] for s in direct["samples"]["maxtext_capitals"]])

  def test_bad_input_is_named(self):
    with self.assertRaisesRegex(ValueError, "Unknown task.*'no_such_task'"):
      harness.evaluate(self.lm, ["no_such_task"])
    with self.assertRaisesRegex(ValueError, "Unknown model_args.*'batch'"):
      lm_eval_adapter.MaxTextLM.create_from_arg_string(
          f"checkpoint={self.checkpoint},batch=3")
    request = instance.Instance("generate_until", doc={}, idx=0, arguments=(
        "1 plus 1 is", {"until": ["\n"], "num_beams": 4}))
    with self.assertRaisesRegex(ValueError, r"generation_kwargs \['num_beams"):
      self.lm.generate_until([request])
    with self.assertRaisesRegex(ValueError, "32000 ids but the model's"
                                " vocab_size is 128"):
      lm_eval_adapter.MaxTextLM(self.lm.model, tokenizer_lib.load_tokenizer(
          assets.default_tokenizer()))
    with self.assertRaisesRegex(ValueError, "add_bos=True but tokenizer"):
      lm_eval_adapter.MaxTextLM(self.lm.model, self.lm.text_tokenizer,
                                add_bos=True)
    with self.assertRaisesRegex(FileNotFoundError, "/no/such/folder"):
      harness.task_manager(["/no/such/folder"])

  def test_checkpoint_tokenizer_path(self):
    self.assertEqual(
        lm_eval_adapter.checkpoint_tokenizer_path(self.checkpoint),
        os.path.join(self.checkpoint, "tokenizer.json"))
    # A training workdir and its step folders: the config's data.tokenizer,
    # or the bundled one when that is empty.
    workdir = self.create_tempdir()
    workdir.create_file("checkpoints/7/state/placeholder")
    config = workdir.create_file("config.json")
    for tokenizer, want in (("/some/tokenizer.model", "/some/tokenizer.model"),
                            ("", assets.default_tokenizer())):
      config.write_text(json.dumps({"data": {"tokenizer": tokenizer}}))
      for path in (workdir.full_path,
                   os.path.join(workdir.full_path, "checkpoints", "7")):
        self.assertEqual(lm_eval_adapter.checkpoint_tokenizer_path(path), want)

if __name__ == "__main__":
  absltest.main()
