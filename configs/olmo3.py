"""OLMo 3: a small model for CPU, and the published sizes.

Train the small default (4 layers: 3 sliding-window + 1 global, about 10M
parameters with the 32k-token Mistral tokenizer) on a CPU in a few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/olmo3.py

A published size (7b, 32b), with an override:

  tools/bazel run //maxtext/bin:train -- --config=configs/olmo3.py:7b \
      --config.optimizer.learning_rate=1e-4

Values follow the Hugging Face configs of allenai/Olmo-3-1025-7B and
allenai/Olmo-3-1125-32B (YaRN over an 8192-token original context).
"""

import ml_collections

from configs import common

# The published sizes' rotary: YaRN over the 8192-token original context.
_YARN = dict(rope_scaling="yarn", rope_scaling_factor=8.0,
             rope_original_max_length=8192)
# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(vocab_size=32_000, num_layers=4, embed_dim=256, mlp_dim=768,
                  num_heads=4, num_kv_heads=4, head_dim=64, sliding_window=128),
    "7b": dict(num_layers=32, embed_dim=4096, mlp_dim=11_008, num_heads=32,
               num_kv_heads=32, **_YARN),
    "32b": dict(num_layers=64, embed_dim=5120, mlp_dim=27_648, num_heads=40,
                num_kv_heads=8, **_YARN),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  return common.family_config(
      "olmo3", arg, VARIANTS, vocab_size=100_278, head_dim=128,
      tie_embeddings=False, norm_eps=1e-6, rope_theta=500_000.0,
      sliding_window=4096, global_layer_interval=4)
