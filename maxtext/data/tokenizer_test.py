"""Tests for maxtext.data.tokenizer."""

import base64
import itertools
import os
import pickle

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

  def test_special_text_and_pickling(self):
    self.assertEqual(self.tok.special_text(self.tok.bos_id), "<s>")
    self.assertEqual(self.tok.special_text(self.tok.eos_id), "</s>")
    self.assertEqual(self.tok.special_texts(), ())  # Never maps text.
    copy = pickle.loads(pickle.dumps(self.tok))
    self.assertEqual(copy.encode("Exeunt omnes."), self.tok.encode(
        "Exeunt omnes."))


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
    self.assertEqual(tok.special_text(2), "</s>")

  def test_special_token_text_is_plain_text_unless_allowed(self):
    path = os.path.join(self.create_tempdir().full_path, "tokenizer.json")
    _write_word_level_tokenizer(path)
    tok = tokenizer_lib.load_tokenizer(path)
    self.assertEqual(tok.encode("<s> to be", allow_special=True), [1, 3, 4])
    self.assertNotIn(1, tok.encode("<s> to be"))
    self.assertCountEqual(tok.special_texts(), ("<s>", "</s>"))
    self.assertEqual(pickle.loads(pickle.dumps(tok)).encode("<s> to be"),
                     tok.encode("<s> to be"))


class TiktokenTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tok = tokenizer_lib.load_tokenizer(assets.gpt2_tiktoken())

  def test_gpt2_ids(self):
    self.assertIsInstance(self.tok, tokenizer_lib.TiktokenTokenizer)
    self.assertEqual(self.tok.vocab_size, 50257)
    self.assertEqual((self.tok.bos_id, self.tok.eos_id), (None, 50256))
    # GPT-2's published ids ("Hello world", " the").
    self.assertEqual(self.tok.encode("Hello world"), [15496, 995])
    self.assertEqual(self.tok.encode(" the"), [262])
    self.assertEqual(self.tok.special_text(50256), "<|endoftext|>")

  def test_round_trip_and_special_text(self):
    text = "Is this a dagger which I see before me? \u00a1S\u00ed! 2024"
    ids = self.tok.encode(text)
    self.assertEqual(self.tok.decode(ids), text)
    self.assertEqual(self.tok.encode_batch([text, "x"]),
                     [ids, self.tok.encode("x")])
    self.assertNotIn(50256, self.tok.encode("end<|endoftext|>"))
    self.assertEqual(self.tok.encode("end<|endoftext|>", allow_special=True),
                     self.tok.encode("end") + [50256])
    self.assertEqual(self.tok.special_texts(), ("<|endoftext|>",))
    copy = pickle.loads(pickle.dumps(self.tok))
    self.assertEqual(copy.encode(text), ids)

  def test_llama3_layout_from_a_tiktoken_model_file(self):
    # A rank file of Llama 3's size (128000 ranks) in its `tokenizer.model`
    # name: every single byte, then made-up multi-byte pieces.
    pieces = [bytes([b]) for b in range(256)]
    pieces += [bytes(p) for p in itertools.islice(
        itertools.product(range(97, 123), repeat=4), 128000 - 256)]
    path = os.path.join(self.create_tempdir().full_path, "tokenizer.model")
    with open(path, "wb") as f:
      for rank, piece in enumerate(pieces):
        f.write(base64.b64encode(piece) + b" %d\n" % rank)
    tok = tokenizer_lib.load_tokenizer(path)
    self.assertIsInstance(tok, tokenizer_lib.TiktokenTokenizer)
    self.assertEqual(tok.vocab_size, 128256)
    self.assertEqual((tok.bos_id, tok.eos_id), (128000, 128001))
    self.assertEqual(tok.encode("<|eot_id|>", allow_special=True), [128009])
    self.assertEqual(tok.encode("<|start_header_id|>", allow_special=True),
                     [128006])
    self.assertEqual(tok.decode(tok.encode("abcd efgh")), "abcd efgh")

  def test_unknown_rank_count_is_named(self):
    path = self.create_tempfile(
        "small.tiktoken", content="YQ== 0\nYg== 1\n").full_path
    with self.assertRaisesRegex(ValueError, "small.tiktoken.*2 ranks"):
      tokenizer_lib.load_tokenizer(path)


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
