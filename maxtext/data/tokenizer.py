"""Tokenizers: one interface over SentencePiece, Hugging Face and tiktoken.

`load_tokenizer(path)` picks the implementation from the file:
  * `*.json` (e.g. `tokenizer.json`): Hugging Face `tokenizers`;
  * `*.tiktoken`, or a `*.model` file in tiktoken's text format (lines of
    "<base64 token> <rank>", e.g. Llama 3's `tokenizer.model`): `tiktoken`,
    with the split pattern and special tokens of the encoding that has that
    many ranks (`TIKTOKEN_ENCODINGS`);
  * other `*.model` files: `sentencepiece`.

Token ids are plain Python ints; `encode` adds no special tokens: the data
pipeline adds BOS/EOS around each document itself (`data.add_bos`,
`data.add_eos`), and only where the vocabulary has them. Text is encoded as
plain text: a literal "<|endoftext|>" in a document is not the special token,
unless `allow_special=True` (chat templates, whose markup is trusted).

Tokenizers pickle as their path, so that grain worker processes reload them.
"""

import abc
import base64
import dataclasses
import os

import sentencepiece
import tiktoken
from tiktoken import load as tiktoken_load
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
  def encode(self, text: str, *, allow_special: bool = False) -> list[int]:
    """Token ids of `text`, without added BOS/EOS.

    Args:
      text: The text.
      allow_special: Map the text of special tokens (e.g. "<|im_start|>") to
        their ids; otherwise they are ordinary text. SentencePiece never maps
        text to its control symbols.
    """

  @abc.abstractmethod
  def decode(self, ids: list[int]) -> str:
    """Text of `ids`."""

  @abc.abstractmethod
  def special_text(self, token_id: int) -> str:
    """The text of one token as vocabularies spell it, e.g. "<s>"."""

  @abc.abstractmethod
  def special_texts(self) -> tuple[str, ...]:
    """The texts `encode(..., allow_special=True)` maps to special ids."""

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    """`encode` of each text; implementations may parallelise."""
    return [self.encode(text) for text in texts]

  def __reduce__(self):
    return (type(self), (self.path,))


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

  def encode(self, text: str, *, allow_special: bool = False) -> list[int]:
    del allow_special  # SentencePiece encodes control symbols as text.
    return self._processor.EncodeAsIds(text)

  def decode(self, ids: list[int]) -> str:
    return self._processor.DecodeIds(list(ids))

  def special_text(self, token_id: int) -> str:
    return self._processor.IdToPiece(token_id)

  def special_texts(self) -> tuple[str, ...]:
    return ()  # Never maps text to its control symbols.

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
    # A copy that maps special-token text to ids, for chat markup; the main
    # one encodes such text as plain text.
    self._with_special = tokenizers.Tokenizer.from_file(path)
    self._tokenizer.encode_special_tokens = True
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

  def encode(self, text: str, *, allow_special: bool = False) -> list[int]:
    tokenizer = self._with_special if allow_special else self._tokenizer
    return tokenizer.encode(text, add_special_tokens=False).ids

  def decode(self, ids: list[int]) -> str:
    return self._tokenizer.decode(list(ids), skip_special_tokens=False)

  def special_text(self, token_id: int) -> str:
    return self._tokenizer.id_to_token(token_id)

  def special_texts(self) -> tuple[str, ...]:
    return tuple(token.content for token in
                 self._with_special.get_added_tokens_decoder().values()
                 if token.special)

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    encodings = self._tokenizer.encode_batch(
        list(texts), add_special_tokens=False)
    return [encoding.ids for encoding in encodings]


@dataclasses.dataclass(frozen=True)
class TiktokenEncoding:
  """What a tiktoken rank file does not store.

  Attributes:
    name: The encoding's name.
    pattern: The regex that splits text before BPE.
    special_tokens: Special token text -> id.
    bos: Text of the beginning-of-sequence token, if any.
    eos: Text of the end-of-sequence token.
  """

  name: str
  pattern: str
  special_tokens: dict[str, int]
  bos: str | None
  eos: str


def _llama3_special_tokens(num_ranks: int) -> dict[str, int]:
  """Llama 3's 256 special tokens (as in Llama 3.2), numbered after the
  ranks; 3.0 and 3.1 differ only in names of reserved ids."""
  named = ["<|begin_of_text|>", "<|end_of_text|>",
           "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
           "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>",
           "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
           "<|image|>"]
  named += [f"<|reserved_special_token_{2 + i}|>"
            for i in range(256 - len(named))]
  return {token: num_ranks + i for i, token in enumerate(named)}


# Known tiktoken encodings by their number of ranks (lines of the file).
TIKTOKEN_ENCODINGS = {
    # GPT-2 / r50k_base (tiktoken_ext.openai_public).
    50256: TiktokenEncoding(
        name="gpt2",
        pattern=(r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++"""
                 r"""| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""),
        special_tokens={"<|endoftext|>": 50256}, bos=None,
        eos="<|endoftext|>"),
    # Llama 3 / 3.1 / 3.2 (`original/tokenizer.model` of the checkpoints).
    128000: TiktokenEncoding(
        name="llama3",
        pattern=(r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+"""
                 r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
                 r"""|\s+(?!\S)|\s+"""),
        special_tokens=_llama3_special_tokens(128000),
        bos="<|begin_of_text|>", eos="<|end_of_text|>"),
}


def is_tiktoken_file(path: str) -> bool:
  """Whether `path` starts like a tiktoken rank file ("<base64> <rank>")."""
  with open(path, "rb") as f:
    first = f.readline(4096).split()
  if len(first) != 2 or not first[1].isdigit():
    return False
  try:
    base64.b64decode(first[0], validate=True)
  except ValueError:
    return False
  return True


class TiktokenTokenizer(Tokenizer):
  """A tiktoken BPE rank file (`*.tiktoken`, Llama 3's `tokenizer.model`)."""

  def __init__(self, path: str):
    self.path = path
    try:
      ranks = tiktoken_load.load_tiktoken_bpe(path)
    except Exception as e:  # tiktoken raises ValueError or binascii.Error.
      raise ValueError(
          f"Tokenizer file {path!r} is not a valid tiktoken rank file: {e}"
      ) from e
    encoding = TIKTOKEN_ENCODINGS.get(len(ranks))
    if encoding is None:
      known = {n: e.name for n, e in TIKTOKEN_ENCODINGS.items()}
      raise ValueError(
          f"Tokenizer file {path!r} has {len(ranks)} ranks, which matches no"
          f" known tiktoken encoding (ranks: name): {known}.")
    self.encoding = encoding
    self._encoding = tiktoken.Encoding(
        encoding.name, pat_str=encoding.pattern, mergeable_ranks=ranks,
        special_tokens=encoding.special_tokens)

  @property
  def vocab_size(self) -> int:
    return self._encoding.n_vocab

  @property
  def bos_id(self) -> int | None:
    bos = self.encoding.bos
    return None if bos is None else self.encoding.special_tokens[bos]

  @property
  def eos_id(self) -> int | None:
    return self.encoding.special_tokens[self.encoding.eos]

  def encode(self, text: str, *, allow_special: bool = False) -> list[int]:
    if allow_special:
      return self._encoding.encode(text, allowed_special="all")
    return self._encoding.encode_ordinary(text)

  def decode(self, ids: list[int]) -> str:
    return self._encoding.decode(list(ids))

  def special_text(self, token_id: int) -> str:
    return self._encoding.decode_single_token_bytes(token_id).decode(
        "utf-8", errors="replace")

  def special_texts(self) -> tuple[str, ...]:
    return tuple(self.encoding.special_tokens)

  def encode_batch(self, texts: list[str]) -> list[list[int]]:
    return self._encoding.encode_ordinary_batch(list(texts), num_threads=1)


def load_tokenizer(path: str) -> Tokenizer:
  """Loads the tokenizer stored at `path`, choosing the library by file.

  Args:
    path: A SentencePiece `.model` file, a Hugging Face `tokenizer.json`, or
      a tiktoken rank file (`*.tiktoken`, or `*.model` in that format).

  Returns:
    The tokenizer.

  Raises:
    FileNotFoundError: `path` does not exist (the error names it).
    ValueError: `path` is of an unknown kind or does not parse.
  """
  if not path:
    raise ValueError("Tokenizer path is empty; set config.data.tokenizer.")
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f"Tokenizer file {path!r} "
        f"{'is not a regular file' if os.path.lexists(path) else 'does not exist'}"
        ".")
  name = os.path.basename(path)
  if name.endswith(".json"):
    return HuggingFaceTokenizer(path)
  if name.endswith(".tiktoken"):
    return TiktokenTokenizer(path)
  if name.endswith(".model") or ".model." in name:
    if is_tiktoken_file(path):
      return TiktokenTokenizer(path)
    return SentencePieceTokenizer(path)
  raise ValueError(
      f"Tokenizer file {path!r} is of an unknown kind: expected a SentencePiece"
      " '*.model' file, a Hugging Face 'tokenizer.json' or a tiktoken"
      " '*.tiktoken' file.")
