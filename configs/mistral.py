"""Mistral 7B: a small model for CPU, and the published sizes.

Train the small default (4 layers, sliding window 64, about 11M parameters
with the 32k-token Mistral tokenizer) on a CPU in a few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/mistral.py

A published size, with an override:

  tools/bazel run //maxtext/bin:train -- --config=configs/mistral.py:7b \
      --config.optimizer.learning_rate=1e-4

Variants: 7b (Mistral-7B-v0.1: every layer has a 4096-token sliding
window), v0.3-7b (Mistral-7B-v0.3: no window, rotary base 1M, 32768-token
vocabulary). Values follow the Hugging Face configs of mistralai/*.
"""

import ml_collections

from configs import common

_MISTRAL_7B = dict(num_layers=32, embed_dim=4096, mlp_dim=14_336,
                   num_heads=32, num_kv_heads=8, head_dim=128)

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(num_layers=4, embed_dim=256, mlp_dim=768, num_heads=4,
                  num_kv_heads=2, head_dim=64, tie_embeddings=True,
                  sliding_window=64),
    "7b": _MISTRAL_7B,
    "v0.3-7b": dict(**_MISTRAL_7B, vocab_size=32_768, rope_theta=1e6,
                    sliding_window=0, global_layer_interval=1),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  config = common.family_config(
      "mistral", arg, VARIANTS, vocab_size=32_000, tie_embeddings=False,
      norm_eps=1e-5,
      # Every layer is local (global_layer_interval=0) when there is a window.
      sliding_window=4096, global_layer_interval=0)
  # Local layers rotate like global ones.
  config.model.rope_local_theta = config.model.get_ref("rope_theta")
  return config
