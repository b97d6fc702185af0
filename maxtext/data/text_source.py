"""Plain-text files -> fixed-length next-token-prediction examples.

Each file is one document. Documents are tokenized, wrapped in BOS ... EOS
(whichever of the two the tokenizer has), concatenated in file-name order into
one token stream `t` of length N, and cut into windows of `seq_len + 1` tokens
that overlap by one token, so that every token after the first is predicted
exactly once:

  window i = t[i * seq_len : i * seq_len + seq_len + 1]
  inputs = window[:-1], targets = window[1:], mask = 1 on real targets.

The last window is padded with `PAD_ID` and its padded targets get mask 0.
"""

from collections.abc import Sequence
import glob
import os

import numpy as np

from maxtext.data import tokenizer as tokenizer_lib

# Fills the tail of the last window; always masked out of the loss.
PAD_ID = 0


def expand_patterns(patterns: str | Sequence[str]) -> list[str]:
  """Files matching glob `patterns` (a comma-separated string or a list).

  Returns:
    Sorted, de-duplicated paths.

  Raises:
    ValueError: no pattern is given.
    FileNotFoundError: a pattern matches no file (the error names it).
  """
  if isinstance(patterns, str):
    patterns = [p.strip() for p in patterns.split(",")]
  patterns = [p for p in patterns if p]
  if not patterns:
    raise ValueError("No text files given; set config.data.text_files.")
  paths = set()
  for pattern in patterns:
    matches = [p for p in glob.glob(os.path.expanduser(pattern), recursive=True)
               if os.path.isfile(p)]
    if not matches:
      raise FileNotFoundError(f"Text file pattern {pattern!r} matches no file.")
    paths.update(matches)
  return sorted(paths)


def read_documents(paths: Sequence[str]) -> list[str]:
  """Reads each UTF-8 file in `paths` as one document.

  Raises:
    ValueError: a file is empty (only whitespace) or not UTF-8; the error
      names the file.
  """
  documents = []
  for path in paths:
    try:
      with open(path, encoding="utf-8") as f:
        text = f.read()
    except UnicodeDecodeError as e:
      raise ValueError(f"Text file {path!r} is not valid UTF-8: {e}") from e
    if not text.strip():
      raise ValueError(f"Text file {path!r} is empty.")
    documents.append(text)
  return documents


def tokenize_documents(tokenizer: tokenizer_lib.Tokenizer,
                       documents: Sequence[str]) -> np.ndarray:
  """Concatenated `[BOS] + encode(doc) + [EOS]` of every document, int32."""
  pieces = []
  bos = [] if tokenizer.bos_id is None else [tokenizer.bos_id]
  eos = [] if tokenizer.eos_id is None else [tokenizer.eos_id]
  for ids in tokenizer.encode_batch(list(documents)):
    pieces.append(np.asarray(bos + list(ids) + eos, dtype=np.int32))
  if not pieces:
    return np.zeros((0,), np.int32)
  return np.concatenate(pieces)


class TextWindows:
  """Random-access examples over a token stream (a grain data source).

  Attributes:
    tokens: The token stream, int32 [N].
    seq_len: Length L of each example.
  """

  def __init__(self, tokens: np.ndarray, seq_len: int, *, name: str = ""):
    """Makes the windows.

    Args:
      tokens: int32 token stream.
      seq_len: Example length; the stream needs at least `seq_len + 1` tokens.
      name: What the stream was read from, for errors.

    Raises:
      ValueError: the stream is shorter than one window.
    """
    if seq_len < 1:
      raise ValueError(f"seq_len must be positive, got {seq_len}.")
    if len(tokens) < seq_len + 1:
      raise ValueError(
          f"Text {name or '(tokens)'} has {len(tokens)} tokens, fewer than one"
          f" window of seq_len + 1 = {seq_len + 1}; add text or lower"
          " config.data.seq_len.")
    self.tokens = np.asarray(tokens, np.int32)
    self.seq_len = seq_len

  def __len__(self) -> int:
    return -(-(len(self.tokens) - 1) // self.seq_len)

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    if not 0 <= index < len(self):
      raise IndexError(f"Window {index} out of range [0, {len(self)}).")
    start = index * self.seq_len
    window = self.tokens[start:start + self.seq_len + 1]
    num_targets = len(window) - 1
    if num_targets < self.seq_len:
      window = np.pad(window, (0, self.seq_len + 1 - len(window)),
                      constant_values=PAD_ID)
    mask = np.zeros((self.seq_len,), np.int32)
    mask[:num_targets] = 1
    return {"inputs": window[:-1], "targets": window[1:], "mask": mask}


def load_text_windows(patterns: str | Sequence[str],
                      tokenizer: tokenizer_lib.Tokenizer,
                      seq_len: int) -> TextWindows:
  """Reads, tokenizes and windows the files matching `patterns`."""
  paths = expand_patterns(patterns)
  tokens = tokenize_documents(tokenizer, read_documents(paths))
  name = ", ".join(repr(p) for p in paths[:3])
  if len(paths) > 3:
    name += f" and {len(paths) - 3} more files"
  return TextWindows(tokens, seq_len, name=name)
