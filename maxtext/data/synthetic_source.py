"""Random-token examples, for benchmarks and tests that need no files.

Example i is a pure function of (seed, i): uniform token ids in
[0, vocab_size), cut into inputs/targets like the text source, mask all ones.
"""

import numpy as np


class SyntheticTokens:
  """Random-access random-token examples (a grain data source).

  Attributes:
    vocab_size: Token ids are drawn from [0, vocab_size).
    seq_len: Length L of each example.
    seed: Seed of the example stream.
    num_examples: Length of one epoch.
  """

  def __init__(self, *, vocab_size: int, seq_len: int, seed: int,
               num_examples: int = 1 << 20):
    if vocab_size < 1 or seq_len < 1 or num_examples < 1:
      raise ValueError(
          "SyntheticTokens needs positive vocab_size, seq_len and num_examples;"
          f" got {vocab_size}, {seq_len}, {num_examples}.")
    self.vocab_size = vocab_size
    self.seq_len = seq_len
    self.seed = seed
    self.num_examples = num_examples

  def __len__(self) -> int:
    return self.num_examples

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    if not 0 <= index < self.num_examples:
      raise IndexError(f"Example {index} out of range [0, {len(self)}).")
    rng = np.random.default_rng([self.seed, index])
    window = rng.integers(0, self.vocab_size, size=self.seq_len + 1,
                          dtype=np.int32)
    return {"inputs": window[:-1], "targets": window[1:],
            "mask": np.ones((self.seq_len,), np.int32)}
