"""Qwen 2.5 (dense): a small model for CPU, and the published sizes.

Train the small default (4 layers, about 11M parameters with the 32k-token
Mistral tokenizer) on a CPU in a few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/qwen2_5.py

A published size (0.5b, 1.5b, 3b, 7b, 14b, 32b, 72b), with an override:

  tools/bazel run //maxtext/bin:train -- --config=configs/qwen2_5.py:7b \
      --config.optimizer.learning_rate=1e-4

Values follow the Hugging Face configs of Qwen/Qwen2.5-*.
"""

import ml_collections

from configs import common

# 7B and larger pad the vocabulary to 152,064 rows and untie the head.
_UNTIED = dict(vocab_size=152_064, tie_embeddings=False)

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(vocab_size=32_000, num_layers=4, embed_dim=256, mlp_dim=768,
                  num_heads=4, num_kv_heads=2, head_dim=64),
    "0.5b": dict(num_layers=24, embed_dim=896, mlp_dim=4864, num_heads=14,
                 num_kv_heads=2, head_dim=64),
    "1.5b": dict(num_layers=28, embed_dim=1536, mlp_dim=8960, num_heads=12,
                 num_kv_heads=2, head_dim=128),
    "3b": dict(num_layers=36, embed_dim=2048, mlp_dim=11_008, num_heads=16,
               num_kv_heads=2, head_dim=128),
    "7b": dict(num_layers=28, embed_dim=3584, mlp_dim=18_944, num_heads=28,
               num_kv_heads=4, head_dim=128, **_UNTIED),
    "14b": dict(num_layers=48, embed_dim=5120, mlp_dim=13_824, num_heads=40,
                num_kv_heads=8, head_dim=128, **_UNTIED),
    "32b": dict(num_layers=64, embed_dim=5120, mlp_dim=27_648, num_heads=40,
                num_kv_heads=8, head_dim=128, **_UNTIED),
    "72b": dict(num_layers=80, embed_dim=8192, mlp_dim=29_568, num_heads=64,
                num_kv_heads=8, head_dim=128, **_UNTIED),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  return common.family_config(
      "qwen2_5", arg, VARIANTS, vocab_size=151_936,
      rope_theta=1_000_000.0)
