"""Qwen 3 MoE: a small model for CPU, and the published sizes.

Train the small default (4 layers of 16 experts, 4 per token) on a CPU in a
few minutes:

  tools/bazel run //maxtext/bin:train -- --config=configs/qwen3_moe.py

A published size (30b-a3b, 235b-a22b), with an override:

  tools/bazel run //maxtext/bin:train -- \
      --config=configs/qwen3_moe.py:30b-a3b --config.model.moe_impl=capacity

Values follow the Hugging Face configs of Qwen/Qwen3-30B-A3B-Base and
Qwen/Qwen3-235B-A22B (mlp_dim is their intermediate_size, used by no layer).
"""

import ml_collections

from configs import common

# What each variant changes from the defaults set in `get_config`.
VARIANTS = {
    "small": dict(vocab_size=32_000, num_layers=4, embed_dim=256,
                  mlp_dim=768, moe_mlp_dim=128, num_heads=4, num_kv_heads=2,
                  head_dim=64, num_experts=16, num_experts_per_token=4),
    "30b-a3b": dict(num_layers=48, embed_dim=2048, mlp_dim=6144,
                    moe_mlp_dim=768, num_heads=32, num_kv_heads=4),
    "235b-a22b": dict(num_layers=94, embed_dim=4096, mlp_dim=12_288,
                      moe_mlp_dim=1536, num_heads=64, num_kv_heads=4),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """Returns the config of variant `arg` (None means "small")."""
  return common.family_config(
      "qwen3_moe", arg, VARIANTS, vocab_size=151_936, head_dim=128,
      tie_embeddings=False, rope_theta=1_000_000.0,
      num_experts=128, num_experts_per_token=8, router_normalize=True,
      load_balance_loss_weight=0.001)
