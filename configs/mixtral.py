"""Mixtral (mixture of experts): a small model for CPU, and the published
sizes.

Train the small default (4 layers of 8 experts, 2 per token) on a CPU in a
few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/mixtral.py

A published size (8x7b, 8x22b), with an override:

  tools/bazel run //maxtext/bin:train -- --config=configs/mixtral.py:8x7b \
      --config.model.moe_impl=capacity

Values follow the Hugging Face configs of mistralai/Mixtral-8x7B-v0.1 and
mistralai/Mixtral-8x22B-v0.1.
"""

import ml_collections

from configs import common

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(num_layers=4, embed_dim=256, mlp_dim=512, moe_mlp_dim=512,
                  num_heads=4, num_kv_heads=2, head_dim=64),
    "8x7b": dict(num_layers=32, embed_dim=4096, mlp_dim=14_336,
                 moe_mlp_dim=14_336, num_heads=32, num_kv_heads=8),
    "8x22b": dict(vocab_size=32_768, num_layers=56, embed_dim=6144,
                  mlp_dim=16_384, moe_mlp_dim=16_384, num_heads=48,
                  num_kv_heads=8),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  return common.family_config(
      "mixtral", arg, VARIANTS, vocab_size=32_000, head_dim=128,
      tie_embeddings=False, norm_eps=1e-5, rope_theta=1_000_000.0,
      num_experts=8, num_experts_per_token=2,
      load_balance_loss_weight=0.02)
