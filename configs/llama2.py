"""Llama 2: a small model for CPU, and the published sizes.

Train the small default (4 layers, about 12M parameters with the 32k-token
Mistral tokenizer, which is Llama 2's) on a CPU in a few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/llama2.py

A published size (7b, 13b, 70b), with an override:

  tools/bazel run //maxtext/bin:train -- --config=configs/llama2.py:7b \
      --config.optimizer.learning_rate=1e-4

Values follow the Hugging Face configs of meta-llama/Llama-2-*-hf.
"""

import ml_collections

from configs import common

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(num_layers=4, embed_dim=256, mlp_dim=768, num_heads=4,
                  num_kv_heads=4, head_dim=64, tie_embeddings=True),
    "7b": dict(num_layers=32, embed_dim=4096, mlp_dim=11_008, num_heads=32,
               num_kv_heads=32, head_dim=128),
    "13b": dict(num_layers=40, embed_dim=5120, mlp_dim=13_824, num_heads=40,
                num_kv_heads=40, head_dim=128),
    "70b": dict(num_layers=80, embed_dim=8192, mlp_dim=28_672, num_heads=64,
                num_kv_heads=8, head_dim=128),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  return common.family_config(
      "llama2", arg, VARIANTS, vocab_size=32_000, tie_embeddings=False,
      norm_eps=1e-5)
