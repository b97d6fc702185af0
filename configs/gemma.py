"""Gemma (1): a small model for CPU, and the published sizes.

Train the small default (4 layers, about 12M parameters with the 32k-token
Mistral tokenizer) on a CPU in a few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/gemma.py

A published size (2b, 7b), with an override:

  tools/bazel run //maxtext/bin:train -- --config=configs/gemma.py:2b \
      --config.optimizer.learning_rate=1e-4

Values follow the Hugging Face configs of google/gemma-{2b,7b}.
"""

import ml_collections

from configs import common

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(vocab_size=32_000, num_layers=4, embed_dim=256,
                  mlp_dim=1024, num_heads=4, num_kv_heads=1, head_dim=64),
    "2b": dict(num_layers=18, embed_dim=2048, mlp_dim=16_384, num_heads=8,
               num_kv_heads=1, head_dim=256),
    "7b": dict(num_layers=28, embed_dim=3072, mlp_dim=24_576, num_heads=16,
               num_kv_heads=16, head_dim=256),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  return common.family_config(
      "gemma", arg, VARIANTS, vocab_size=256_000, mlp_activation="gelu_tanh")
