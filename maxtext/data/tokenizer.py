"""Tokenizers: one interface over SentencePiece and Hugging Face files.

`load_tokenizer(path)` picks the implementation from the file:
  * `*.model` (or any file that parses as a SentencePiece model proto):
    `sentencepiece`;
  * `*.json` (e.g. `tokenizer.json`): Hugging Face `tokenizers`.

Token ids are plain Python ints; `encode` adds no special tokens: the text
source adds BOS/EOS around each document itself.
"""

import abc
import os

import sentencepiece
import tokenizers

# Special tokens looked up in a Hugging Face vocabulary, most common first.
_HF_BOS_TOKENS = ("<s>", "<bos>", "<|begin_of_text|>", "<|startoftext|>")
_HF_EOS_TOKENS = ("</s>", "<eos>", "<|end_of_text|>", "<|endoftext|>",
                  "<|eot_id|>")


class Tokenizer(abc.ABC):
  """Text <-> token ids.

  Attributes:
    path: The file the tokenizer was loaded from.
  """

  path: str

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """Number of token ids (the largest id plus one)."""

  @property
  @abc.abstractmethod
  def bos_id(self) -> int | None:
    """Beginning-of-sequence id, or None when the vocabulary has none."""

  @property
  @abc.abstractmethod
  def eos_id(self) -> int | None:
    """End-of-sequence id, or None when the vocabulary has none."""

  @abc.abstractmethod
  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without special tokens."""

  @abc.abstractmethod
  def decode(self, ids: list[int]) -> str:
    """Text of `ids`."""

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    """`encode` of each text; implementations may parallelise."""
    return [self.encode(text) for text in texts]


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece `.model` file."""

  def __init__(self, path: str):
    self.path = path
    self._processor = sentencepiece.SentencePieceProcessor()
    try:
      self._processor.Load(path)
    except (RuntimeError, OSError) as e:
      raise ValueError(
          f"Tokenizer file {path!r} is not a valid SentencePiece model: {e}"
      ) from e

  @property
  def vocab_size(self) -> int:
    return self._processor.vocab_size()

  @property
  def bos_id(self) -> int | None:
    bos = self._processor.bos_id()
    return None if bos < 0 else bos

  @property
  def eos_id(self) -> int | None:
    eos = self._processor.eos_id()
    return None if eos < 0 else eos

  def encode(self, text: str) -> list[int]:
    return self._processor.EncodeAsIds(text)

  def decode(self, ids: list[int]) -> str:
    return self._processor.DecodeIds(list(ids))

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    return self._processor.Encode(list(texts), out_type=int)


class HuggingFaceTokenizer(Tokenizer):
  """A Hugging Face `tokenizer.json` file (the `tokenizers` library)."""

  def __init__(self, path: str):
    self.path = path
    try:
      self._tokenizer = tokenizers.Tokenizer.from_file(path)
    except Exception as e:  # tokenizers raises a bare Exception.
      raise ValueError(
          f"Tokenizer file {path!r} is not a valid Hugging Face tokenizer.json:"
          f" {e}") from e
    self._bos_id = self._find(_HF_BOS_TOKENS)
    self._eos_id = self._find(_HF_EOS_TOKENS)

  def _find(self, candidates: tuple[str, ...]) -> int | None:
    for token in candidates:
      token_id = self._tokenizer.token_to_id(token)
      if token_id is not None:
        return token_id
    return None

  @property
  def vocab_size(self) -> int:
    return self._tokenizer.get_vocab_size(with_added_tokens=True)

  @property
  def bos_id(self) -> int | None:
    return self._bos_id

  @property
  def eos_id(self) -> int | None:
    return self._eos_id

  def encode(self, text: str) -> list[int]:
    return self._tokenizer.encode(text, add_special_tokens=False).ids

  def decode(self, ids: list[int]) -> str:
    return self._tokenizer.decode(list(ids), skip_special_tokens=False)

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    encodings = self._tokenizer.encode_batch(
        list(texts), add_special_tokens=False)
    return [encoding.ids for encoding in encodings]


def load_tokenizer(path: str) -> Tokenizer:
  """Loads the tokenizer stored at `path`, choosing the library by file.

  Args:
    path: A SentencePiece `.model` file or a Hugging Face `tokenizer.json`.

  Returns:
    The tokenizer.

  Raises:
    FileNotFoundError: `path` does not exist (the error names it).
    ValueError: `path` is of an unknown kind or does not parse.
  """
  if not path:
    raise ValueError("Tokenizer path is empty; set config.data.tokenizer.")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"Tokenizer file {path!r} does not exist.")
  name = os.path.basename(path)
  if name.endswith(".json"):
    return HuggingFaceTokenizer(path)
  if name.endswith(".model") or ".model." in name:
    return SentencePieceTokenizer(path)
  raise ValueError(
      f"Tokenizer file {path!r} is of an unknown kind: expected a SentencePiece"
      " '*.model' file or a Hugging Face 'tokenizer.json'.")
