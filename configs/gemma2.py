"""Gemma 2: a small model for CPU, and the published sizes.

Train the small default (6 layers alternating local and global, about 14M
parameters with the 32k-token Mistral tokenizer) on a CPU in a few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/gemma2.py

A published size (2b, 9b, 27b), with an override:

  tools/bazel run //maxtext/bin:train -- --config=configs/gemma2.py:9b \
      --config.optimizer.learning_rate=1e-4

Values follow the Hugging Face configs of google/gemma-2-*.
"""

import ml_collections

from configs import common

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(vocab_size=32_000, num_layers=6, embed_dim=256,
                  mlp_dim=1024, num_heads=4, num_kv_heads=2, head_dim=64,
                  query_pre_attn_scalar=64.0, sliding_window=64),
    "2b": dict(num_layers=26, embed_dim=2304, mlp_dim=9216, num_heads=8,
               num_kv_heads=4, head_dim=256, query_pre_attn_scalar=256.0),
    "9b": dict(num_layers=42, embed_dim=3584, mlp_dim=14_336, num_heads=16,
               num_kv_heads=8, head_dim=256, query_pre_attn_scalar=256.0),
    # 27b scales queries by (embed_dim / num_heads)**-0.5, not head_dim.
    "27b": dict(num_layers=46, embed_dim=4608, mlp_dim=36_864, num_heads=32,
                num_kv_heads=16, head_dim=128, query_pre_attn_scalar=144.0),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  config = common.family_config(
      "gemma2", arg, VARIANTS, vocab_size=256_000,
      # Local and global layers alternate, local first.
      sliding_window=4096, global_layer_interval=2,
      # The attention-logit soft-cap needs the reference kernel.
      attn_logit_softcap=50.0, final_logit_softcap=30.0,
      mlp_activation="gelu_tanh")
  # Local layers rotate like global ones.
  config.model.rope_local_theta = config.model.get_ref("rope_theta")
  return config
