"""Tests perplexity on JSONL and text files against exp(mean NLL) computed
with transformers on the same converted weights and the same windows."""

import json
import math
import os
import tempfile

from absl.testing import absltest

from maxtext.checkpoint import params_checkpoint
from maxtext.data import tokenizer as tokenizer_lib
from maxtext.eval import hf_eval_reference
from maxtext.eval import perplexity
from maxtext.eval import scoring

_MAX_LENGTH = 32
_TEXTS = ["Now is the winter of our discontent\nMade glorious summer by this "
          "sun of York;", "A horse!", "Shall I compare thee to a summer's day?"]


class PerplexityTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    folder = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    cls.hf_model, checkpoint = hf_eval_reference.converted_tiny_checkpoint(
        folder)
    cls.scorer = scoring.Scorer(
        params_checkpoint.model_from_params(
            *params_checkpoint.load_params(checkpoint)),
        max_length=_MAX_LENGTH, batch_size=4)
    cls.tokenizer = tokenizer_lib.load_tokenizer(
        os.path.join(checkpoint, "tokenizer.json"))

  def test_jsonl_perplexity_matches_transformers(self):
    path = self.create_tempfile("docs.jsonl", "".join(
        json.dumps({"body": text}) + "\n" for text in _TEXTS)).full_path
    documents = perplexity.read_documents(path, self.tokenizer,
                                          text_field="body")
    self.assertEqual(documents, [self.tokenizer.encode(t) for t in _TEXTS])
    got = perplexity.perplexity(self.scorer, documents, prefix_id=0)
    nll = -sum(hf_eval_reference.rolling_loglikelihood(
        self.hf_model, tokens, prefix_id=0, max_length=_MAX_LENGTH)
               for tokens in documents)
    tokens = sum(len(text) for text in _TEXTS)
    print(f"perplexity {got.perplexity:.6f} vs transformers'"
          f" {math.exp(nll / tokens):.6f}")
    self.assertEqual((got.tokens, got.documents), (tokens, 3))
    # A sum over every token: within 1e-5 relative.
    self.assertAlmostEqual(got.nll, nll, delta=1e-5 * abs(nll))
    self.assertAlmostEqual(got.perplexity, math.exp(nll / tokens),
                           delta=1e-5 * got.perplexity)

  def test_text_files_and_limit(self):
    folder = self.create_tempdir()
    for i, text in enumerate(_TEXTS):
      folder.create_file(f"{i}.txt", text)
    documents = perplexity.read_documents(
        os.path.join(folder.full_path, "*.txt"), self.tokenizer, kind="text",
        limit=2)
    self.assertEqual(documents, [self.tokenizer.encode(t) for t in _TEXTS[:2]])

  def test_bad_documents_are_named(self):
    path = self.create_tempfile("docs.jsonl", '{"text": "fine"}\n{"txt": 1}\n'
                                ).full_path
    with self.assertRaisesRegex(ValueError, r"docs.jsonl:2 .*no field 'text'"):
      perplexity.read_documents(path, self.tokenizer)
    with self.assertRaisesRegex(ValueError, "No documents"):
      perplexity.perplexity(self.scorer, [], prefix_id=0)


if __name__ == "__main__":
  absltest.main()
