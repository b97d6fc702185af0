"""Qwen 3 (dense): a small model for CPU, and the published sizes.

Train the small default (4 layers, about 11M parameters with the 32k-token
Mistral tokenizer) on a CPU in a few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/qwen3.py

A published size (0.6b, 1.7b, 4b, 8b, 14b, 32b), with an override:

  tools/bazel run //maxtext/bin:train -- --config=configs/qwen3.py:8b \
      --config.optimizer.learning_rate=1e-4

Values follow the Hugging Face configs of Qwen/Qwen3-*-Base.
"""

import ml_collections

from configs import common

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(vocab_size=32_000, num_layers=4, embed_dim=256, mlp_dim=768,
                  num_heads=4, num_kv_heads=2, head_dim=64),
    "0.6b": dict(num_layers=28, embed_dim=1024, mlp_dim=3072, num_heads=16,
                 num_kv_heads=8),
    "1.7b": dict(num_layers=28, embed_dim=2048, mlp_dim=6144, num_heads=16,
                 num_kv_heads=8),
    "4b": dict(num_layers=36, embed_dim=2560, mlp_dim=9728, num_heads=32,
               num_kv_heads=8),
    "8b": dict(num_layers=36, embed_dim=4096, mlp_dim=12_288, num_heads=32,
               num_kv_heads=8, tie_embeddings=False),
    "14b": dict(num_layers=40, embed_dim=5120, mlp_dim=17_408, num_heads=40,
                num_kv_heads=8, tie_embeddings=False),
    "32b": dict(num_layers=64, embed_dim=5120, mlp_dim=25_600, num_heads=64,
                num_kv_heads=8, tie_embeddings=False),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  return common.family_config(
      "qwen3", arg, VARIANTS, vocab_size=151_936, head_dim=128,
      rope_theta=1_000_000.0)
