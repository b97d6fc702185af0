"""Tests for maxtext.data.text_source."""

import os

from absl.testing import absltest
import numpy as np

from maxtext.data import assets
from maxtext.data import text_source
from maxtext.data import tokenizer as tokenizer_lib

_DOC_A = "To be, or not to be, that is the question:\n"
_DOC_B = "Whether 'tis nobler in the mind to suffer\nThe slings and arrows.\n"


class TextSourceTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tok = tokenizer_lib.load_tokenizer(assets.default_tokenizer())
    self.dir = self.create_tempdir().full_path
    for name, text in (("a.txt", _DOC_A), ("b.txt", _DOC_B)):
      with open(os.path.join(self.dir, name), "w", encoding="utf-8") as f:
        f.write(text)

  def test_windows_are_the_bos_eos_wrapped_token_stream(self):
    seq_len = 8
    windows = text_source.load_text_windows(
        os.path.join(self.dir, "*.txt"), self.tok, seq_len)
    # Hand-built stream: files in name order, each [BOS] ids [EOS].
    stream = ([1] + self.tok.encode(_DOC_A) + [2] + [1] +
              self.tok.encode(_DOC_B) + [2])
    np.testing.assert_array_equal(windows.tokens, stream)
    self.assertLen(windows, -(-(len(stream) - 1) // seq_len))
    for i in range(len(windows)):
      example = windows[i]
      chunk = stream[i * seq_len:i * seq_len + seq_len + 1]
      n = len(chunk) - 1
      np.testing.assert_array_equal(example["inputs"][:n], chunk[:-1])
      np.testing.assert_array_equal(example["targets"][:n], chunk[1:])
      np.testing.assert_array_equal(example["mask"],
                                    [1] * n + [0] * (seq_len - n))
      np.testing.assert_array_equal(example["targets"][n:],
                                    text_source.PAD_ID)
      for value in example.values():
        self.assertEqual(value.shape, (seq_len,))
        self.assertEqual(value.dtype, np.int32)
    # Every target of the stream is predicted exactly once.
    targets = np.concatenate(
        [w["targets"][w["mask"] == 1] for w in map(windows.__getitem__,
                                                   range(len(windows)))])
    np.testing.assert_array_equal(targets, stream[1:])
    self.assertEqual(self.tok.decode(list(windows[0]["inputs"][1:])),
                     self.tok.decode(stream[1:seq_len]))

  def test_comma_separated_patterns_and_order(self):
    paths = text_source.expand_patterns(
        f"{self.dir}/b.txt, {self.dir}/a*.txt")
    self.assertEqual([os.path.basename(p) for p in paths], ["a.txt", "b.txt"])

  def test_pattern_without_match_is_named(self):
    with self.assertRaisesRegex(FileNotFoundError, "nothing_here"):
      text_source.expand_patterns(os.path.join(self.dir, "nothing_here*.txt"))

  def test_empty_file_is_named(self):
    empty = self.create_tempfile("empty.txt", content="  \n").full_path
    with self.assertRaisesRegex(ValueError, "empty.txt.*empty"):
      text_source.load_text_windows(empty, self.tok, 8)

  def test_non_utf8_file_is_named(self):
    path = os.path.join(self.dir, "latin1.txt")
    with open(path, "wb") as f:
      f.write("caf\xe9".encode("latin-1"))
    with self.assertRaisesRegex(ValueError, "latin1.txt.*UTF-8"):
      text_source.load_text_windows(path, self.tok, 8)

  def test_text_shorter_than_one_window_is_named(self):
    path = os.path.join(self.dir, "a.txt")
    with self.assertRaisesRegex(ValueError, "a.txt.*fewer than one window"):
      text_source.load_text_windows(path, self.tok, 1000)


if __name__ == "__main__":
  absltest.main()
