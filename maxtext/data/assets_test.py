"""The bundled assets are real: Shakespeare's text and a 32000-piece tokenizer."""

import os

from absl.testing import absltest
import sentencepiece

from maxtext.data import assets


class AssetsTest(absltest.TestCase):

  def test_texts_are_shakespeare(self):
    files = assets.default_text_files()
    self.assertGreater(len(files), 30)
    names = [os.path.basename(f) for f in files]
    self.assertIn("hamlet_gut.txt", names)
    with open(files[names.index("hamlet_gut.txt")], encoding="latin-1") as f:
      self.assertIn("To be, or not to be", f.read())

  def test_tokenizer_is_mistral_v1(self):
    processor = sentencepiece.SentencePieceProcessor(
        model_file=assets.default_tokenizer()
    )
    self.assertEqual(processor.vocab_size(), 32000)
    ids = processor.encode("To be, or not to be")
    self.assertEqual(processor.decode(ids), "To be, or not to be")

  def test_missing_asset_names_the_variable(self):
    old = os.environ.get("MAXTEXT_TOKENIZER")
    os.environ["MAXTEXT_TOKENIZER"] = "/nonexistent/tokenizer.model"
    try:
      with self.assertRaisesRegex(FileNotFoundError, "MAXTEXT_TOKENIZER"):
        assets.default_tokenizer()
    finally:
      if old is None:
        del os.environ["MAXTEXT_TOKENIZER"]
      else:
        os.environ["MAXTEXT_TOKENIZER"] = old


if __name__ == "__main__":
  absltest.main()
