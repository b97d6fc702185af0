"""Llama 3 / 3.1 / 3.2: a small model for CPU, and the published sizes.

Train the small default (4 layers, about 11M parameters with the 32k-token
Mistral tokenizer) on a CPU in a few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/llama3.py

A published size, with an override:

  tools/bazel run //maxtext/bin:train -- --config=configs/llama3.py:3.1-8b \
      --config.optimizer.learning_rate=1e-4

Variants: 8b, 70b (Llama 3); 3.1-8b, 3.1-70b, 3.1-405b (and its alias 405b);
3.2-1b, 3.2-3b. Values follow the Hugging Face configs of meta-llama/*.
"""

import ml_collections

from configs import common

_LLAMA_3_8B = dict(num_layers=32, embed_dim=4096, mlp_dim=14_336,
                   num_heads=32, num_kv_heads=8, head_dim=128,
                   tie_embeddings=False)
_LLAMA_3_70B = dict(num_layers=80, embed_dim=8192, mlp_dim=28_672,
                    num_heads=64, num_kv_heads=8, head_dim=128,
                    tie_embeddings=False)
_LLAMA_3_405B = dict(num_layers=126, embed_dim=16_384, mlp_dim=53_248,
                     num_heads=128, num_kv_heads=8, head_dim=128,
                     tie_embeddings=False)
# Llama 3.1 and 3.2 scale rotary frequencies for long context.
_ROPE_3_1 = dict(rope_scaling="llama3", rope_scaling_factor=8.0)
_ROPE_3_2 = dict(rope_scaling="llama3", rope_scaling_factor=32.0)

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(vocab_size=32_000, num_layers=4, embed_dim=256, mlp_dim=768,
                  num_heads=4, num_kv_heads=2, head_dim=64,
                  tie_embeddings=True),
    "8b": _LLAMA_3_8B,
    "70b": _LLAMA_3_70B,
    "3.1-8b": {**_LLAMA_3_8B, **_ROPE_3_1},
    "3.1-70b": {**_LLAMA_3_70B, **_ROPE_3_1},
    "3.1-405b": {**_LLAMA_3_405B, **_ROPE_3_1},
    "405b": {**_LLAMA_3_405B, **_ROPE_3_1},
    "3.2-1b": dict(num_layers=16, embed_dim=2048, mlp_dim=8192, num_heads=32,
                   num_kv_heads=8, head_dim=64, tie_embeddings=True,
                   **_ROPE_3_2),
    "3.2-3b": dict(num_layers=28, embed_dim=3072, mlp_dim=8192, num_heads=24,
                   num_kv_heads=8, head_dim=128, tie_embeddings=True,
                   **_ROPE_3_2),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  return common.family_config(
      "llama3", arg, VARIANTS, vocab_size=128_256, tie_embeddings=False,
      norm_eps=1e-5, rope_theta=500_000.0)
