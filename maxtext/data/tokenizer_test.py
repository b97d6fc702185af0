"""Tests for maxtext.data.tokenizer."""

import os

from absl.testing import absltest
import tokenizers
from tokenizers import models as tokenizer_models
from tokenizers import pre_tokenizers

from maxtext.data import assets
from maxtext.data import tokenizer as tokenizer_lib


def _write_word_level_tokenizer(path: str) -> None:
  vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "to": 3, "be": 4, "or": 5,
           "not": 6}
  tok = tokenizers.Tokenizer(
      tokenizer_models.WordLevel(vocab=vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.add_special_tokens(["<s>", "</s>"])
  tok.save(path)


class SentencePieceTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tok = tokenizer_lib.load_tokenizer(assets.default_tokenizer())

  def test_is_sentencepiece_with_mistral_special_ids(self):
    self.assertIsInstance(self.tok, tokenizer_lib.SentencePieceTokenizer)
    self.assertEqual(self.tok.vocab_size, 32000)
    self.assertEqual(self.tok.bos_id, 1)
    self.assertEqual(self.tok.eos_id, 2)

  def test_encode_matches_sentencepiece_and_round_trips(self):
    text = "To be, or not to be: that is the question."
    ids = self.tok.encode(text)
    self.assertNotIn(self.tok.bos_id, ids)
    self.assertEqual(self.tok.decode(ids), text)
    self.assertEqual(self.tok.encode_batch([text, "Hello"]),
                     [ids, self.tok.encode("Hello")])


class HuggingFaceTest(absltest.TestCase):

  def test_word_level_tokenizer(self):
    path = os.path.join(self.create_tempdir().full_path, "tokenizer.json")
    _write_word_level_tokenizer(path)
    tok = tokenizer_lib.load_tokenizer(path)
    self.assertIsInstance(tok, tokenizer_lib.HuggingFaceTokenizer)
    self.assertEqual(tok.vocab_size, 7)
    self.assertEqual((tok.bos_id, tok.eos_id), (1, 2))
    self.assertEqual(tok.encode("to be or not to be"), [3, 4, 5, 6, 3, 4])
    self.assertEqual(tok.encode_batch(["not", "be"]), [[6], [4]])


class ErrorsTest(absltest.TestCase):

  def test_missing_file_names_path(self):
    path = "/nonexistent/tokenizer.model"
    with self.assertRaisesRegex(FileNotFoundError, path):
      tokenizer_lib.load_tokenizer(path)

  def test_unknown_kind_names_path(self):
    path = self.create_tempfile("vocab.txt", content="a b c").full_path
    with self.assertRaisesRegex(ValueError, "unknown kind.*vocab.txt|vocab.txt"
                                ".*unknown kind"):
      tokenizer_lib.load_tokenizer(path)

  def test_corrupt_sentencepiece_names_path(self):
    path = self.create_tempfile("bad.model", content="not a proto").full_path
    with self.assertRaisesRegex(ValueError, "bad.model.*SentencePiece"):
      tokenizer_lib.load_tokenizer(path)

  def test_corrupt_json_names_path(self):
    path = self.create_tempfile("tokenizer.json", content="{").full_path
    with self.assertRaisesRegex(ValueError, "tokenizer.json"):
      tokenizer_lib.load_tokenizer(path)

  def test_empty_path(self):
    with self.assertRaisesRegex(ValueError, "config.data.tokenizer"):
      tokenizer_lib.load_tokenizer("")


if __name__ == "__main__":
  absltest.main()
